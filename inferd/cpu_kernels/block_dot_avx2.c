/* block_gemv.c's inner loop for AVX2 (+ FMA, F16C), with AVX-VNNI where the build has it
 * (inferd).
 *
 * A 256-bit vector holds one activation block: 32 activations (each two int8 terms,
 * block_layout.h) against 32 stored weights (unsigned bytes s = q + zero), each int32 lane
 * collecting four products, which the block's two scales then turn into floats. AVX-VNNI does
 * the four multiply-adds of a term in one instruction (vpdpbusd), starting from -zero * (the
 * four activations' sum). Without it, see products and, for 8-bit weights, dot_wide. The
 * 4-bit layout gives both halves of a 64-weight chunk from one 32-byte load (low and high
 * nibbles); the 5-bit one adds a fifth bit per weight from one 64-bit word. */
#include "block_layout.h"

#ifdef INFERD_ISA_AVX2
#include <immintrin.h>

/* Loops over the rows of a step are short and constant: unrolled, their accumulators stay in
 * registers (an array the compiler indexes at run time would live in memory). */
#define UNROLL _Pragma("GCC unroll 16")

/* Where one row's data are: its first chunk in q (and high), the distance between chunks (4
 * chunks apart when interleaved), and its first scale; the inner loop only adds. */
typedef struct {
    const uint8_t *q, *high;
    const char* scale;
    int64_t q_step, high_step;
} RowPtr;

static inline RowPtr row_ptr(const BlockMatrix* W, int64_t n, int bits) {
    const int64_t cb = bits == 8 ? 64 : 32, group = W->interleaved ? 4 : 1;
    const int64_t scale_bytes = W->half_scales ? 2 : 4;
    RowPtr p = {W->q + chunk_at(W, n, 0, cb), NULL,
                (const char*)W->scale + n * (W->K / W->B) * scale_bytes, cb * group, 8 * group};
    if (bits == 5) p.high = W->high + chunk_at(W, n, 0, 8);
    return p;
}

/* 32 bits -> 32 bytes, byte j = 16 where bit j is set (the fifth bit of weight j), else 0. */
static inline __m256i fifth_bits(uint32_t bits) {
    const __m256i byte_of_bit = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                                  0x0101010101010101LL, 0);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), byte_of_bit);
    /* all bits but bit j % 8 set: the byte is all ones exactly where that bit was set */
    v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7FBFDFEFF7FBFDFELL));
    v = _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
    return _mm256_and_si256(v, _mm256_set1_epi8(16));
}

/* Half h (weights 32h .. 32h+31) of chunk c, as unsigned bytes; `packed` is the chunk's 32
 * nibble bytes (4 and 5 bits), loaded once for both halves. */
static inline __attribute__((always_inline)) __m256i half_weights(RowPtr p, int64_t c, int h,
                                                                  __m256i packed, const int bits) {
    if (bits == 8) return _mm256_loadu_si256((const __m256i*)(p.q + c * p.q_step + 32 * h));
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256i w = _mm256_and_si256(h ? _mm256_srli_epi16(packed, 4) : packed, low4);
    if (bits == 5) {
        uint32_t fifth;
        memcpy(&fifth, p.high + c * p.high_step + 4 * h, 4);
        w = _mm256_or_si256(w, fifth_bits(fifth));
    }
    return w;
}

/* The scales of a row's 32 weights from k, per int32 lane (B = 16: lanes 0-3 and 4-7 belong
 * to two blocks); `shift` is log2(B). Reads only these weights' scales. */
static inline __attribute__((always_inline)) __m256 lane_scales(RowPtr p, int64_t k, int shift,
                                                                const int half) {
    const int64_t first = k >> shift;
    if (shift == 5) {
        return half ? _mm256_set1_ps(_cvtsh_ss(((const uint16_t*)p.scale)[first]))
                    : _mm256_broadcast_ss((const float*)p.scale + first);
    }
    __m128 two;
    if (half) {
        int32_t bits;
        memcpy(&bits, (const uint16_t*)p.scale + first, 4);
        two = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
    } else {
        two = _mm_castpd_ps(_mm_load_sd((const double*)((const float*)p.scale + first)));
    }
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(two),
                                    _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0));
}

#ifndef __AVXVNNI__
/* Per int32 lane, without AVX-VNNI: gain * the four products of the weights' integers and int8
 * activations a. vpmaddubsw (u8 x s8, pairs summed into int16), then vpmaddwd (pairs times gain
 * into int32). vpmaddubsw saturates at 32767: 4- and 5-bit weights (s < 32) x |a| <= 127 stay
 * far below, but 8-bit ones (s up to 255) would not. Those are recentred to q = s - 128 in
 * [-128, 127] and multiplied as |q| (unsigned, <= 128) by a with q's sign: a pair is at most
 * 2 * 128 * 127 = 32512, and the zero point is already gone (the caller leaves out c). */
static inline __attribute__((always_inline)) __m256i products(__m256i w, __m256i a,
                                                              const int bits, const int gain) {
    const __m256i g = _mm256_set1_epi16((short)gain);
    if (bits == 8) {
        const __m256i q = _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80));
        return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(q, q),
                                                      _mm256_sign_epi8(a, q)), g);
    }
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), g);
}
#endif

/* Per int32 lane: c + the four products of stored weights w and activations 256 a1 + a2
 * (block_layout.h); with AVX-VNNI two vpdpbusd, as block_dot_avx512.c does. */
static inline __attribute__((always_inline)) __m256i dot4(__m256i c, __m256i w, __m256i a1,
                                                          __m256i a2, const int bits) {
#ifdef __AVXVNNI__
    (void)bits;
    const __m256i high = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w, a1);
    return _mm256_add_epi32(_mm256_dpbusd_avx_epi32(c, w, a2),
                            _mm256_slli_epi32(high, RESIDUAL_SHIFT));
#else
    const __m256i p = _mm256_add_epi32(products(w, a1, bits, 1 << RESIDUAL_SHIFT),
                                       products(w, a2, bits, 1));
    return bits == 8 ? p : _mm256_add_epi32(c, p);
#endif
}

#ifndef __AVXVNNI__
/* 8-bit weights in blocks of 32 (Q8_0, the usual embedding and LM head), without AVX-VNNI: the
 * stored bytes s widened to int16 as they are loaded (vpmovzxbw), times the activations as int16
 * (xw = 256 a1 + a2) with vpmaddwd, from c, which removes the zero point: as many instructions
 * as one int8 term took with the sign trick of `products`. Lane i sums weights 2i, 2i+1, 16+2i
 * and 17+2i: one block, whose correction c spreads over the lanes differently from vpdpbusd's,
 * which its single scale does not mind. (|s| <= 255 times |xw| <= 32639, four per lane, plus
 * c: within int32.) */
typedef struct {
    __m256i lo, hi;
} Wide;

static inline __attribute__((always_inline)) Wide widen(const uint8_t* stored) {
    return (Wide){_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)stored)),
                  _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(stored + 16)))};
}

static inline __attribute__((always_inline)) __m256i dot_wide(__m256i c, Wide w,
                                                              const int16_t* a) {
    const __m256i lo = _mm256_madd_epi16(w.lo, _mm256_loadu_si256((const __m256i*)a));
    const __m256i hi = _mm256_madd_epi16(w.hi, _mm256_loadu_si256((const __m256i*)(a + 16)));
    return _mm256_add_epi32(_mm256_add_epi32(c, lo), hi);
}
#endif

static inline float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Weights [k, k + 32 * halves) of R rows against M activation rows, into acc [M, R]. `wide`:
 * 8-bit weights in blocks of 32 through dot_wide. */
static inline __attribute__((always_inline)) void chunk_dot(
    const RowPtr* rp, QuantRows x, int64_t K, int64_t k, int shift, const int halves,
    const int M, const int R, const int bits, const int half, const int wide, __m256* acc) {
    const int64_t c = k / 64;
    __m256i packed[4];
    UNROLL
    for (int r = 0; r < R; r++)
        packed[r] = bits == 8 ? _mm256_setzero_si256()
                              : _mm256_loadu_si256((const __m256i*)(rp[r].q + c * rp[r].q_step));
    UNROLL
    for (int h = 0; h < halves; h++) {
        const int64_t kh = k + 32 * h;
#ifndef __AVXVNNI__
        if (wide) {
            Wide w[4];
            UNROLL
            for (int r = 0; r < R; r++) w[r] = widen(rp[r].q + c * rp[r].q_step + 32 * h);
            UNROLL
            for (int m = 0; m < M; m++) {
                const __m256i cz = _mm256_loadu_si256((const __m256i*)(x.xc + m * (K / 4) + kh / 4));
                const __m256 d = _mm256_broadcast_ss(x.xl + m * (K / 4) + kh / 4);
                UNROLL
                for (int r = 0; r < R; r++) {
                    const __m256 p = _mm256_cvtepi32_ps(dot_wide(cz, w[r], x.xw + m * K + kh));
                    const __m256 s = lane_scales(rp[r], kh, 5, half);
                    acc[m * R + r] = _mm256_fmadd_ps(_mm256_mul_ps(s, d), p, acc[m * R + r]);
                }
            }
            continue;
        }
#endif
        UNROLL
        for (int m = 0; m < M; m++) {
            const __m256i a1 = _mm256_loadu_si256((const __m256i*)(x.xq + m * K + kh));
            const __m256i a2 = _mm256_loadu_si256((const __m256i*)(x.xr + m * K + kh));
            const __m256i cz = _mm256_loadu_si256((const __m256i*)(x.xc + m * (K / 4) + kh / 4));
            const __m256 d = _mm256_broadcast_ss(x.xl + m * (K / 4) + kh / 4);
            UNROLL
            for (int r = 0; r < R; r++) {
                const __m256i w = half_weights(rp[r], c, h, packed[r], bits);
                const __m256 p = _mm256_cvtepi32_ps(dot4(cz, w, a1, a2, bits));
                const __m256 s = lane_scales(rp[r], kh, shift, half);
                acc[m * R + r] = _mm256_fmadd_ps(_mm256_mul_ps(s, d), p, acc[m * R + r]);
            }
        }
    }
}

/* R weight rows (n, n+1, ...) against M activation rows; M, R, bits, half and wide are
 * compile-time constants in each instantiation (ROW_DOT), so the accumulators stay in the 16
 * registers. */
static inline __attribute__((always_inline)) void row_dot_m(
    const BlockMatrix* W, int64_t n, QuantRows x, const int M, const int R, const int bits,
    const int half, const int wide, float* out /* [M, R] */) {
    const int64_t K = W->K;
    const int shift = W->B == 32 ? 5 : 4;
    __m256 acc[8];
    UNROLL
    for (int i = 0; i < M * R; i++) acc[i] = _mm256_setzero_ps();
    RowPtr rp[4];
    UNROLL
    for (int r = 0; r < R; r++) rp[r] = row_ptr(W, n + r, bits);
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) chunk_dot(rp, x, K, k, shift, 2, M, R, bits, half, wide, acc);
    if (k < K) chunk_dot(rp, x, K, k, shift, 1, M, R, bits, half, wide, acc); /* K%64 == 32 */
    UNROLL
    for (int i = 0; i < M * R; i++) out[i] = sum8(acc[i]);
}

#define ROW_DOT(name, bits, half, wide)                                                       \
    static void name(const BlockMatrix* W, int64_t n, int64_t R, QuantRows x, int64_t M,      \
                     float* out) {                                                            \
        if (R == 1) {                                                                         \
            switch (M) {                                                                      \
                case 1: row_dot_m(W, n, x, 1, 1, bits, half, wide, out); break;               \
                case 2: row_dot_m(W, n, x, 2, 1, bits, half, wide, out); break;               \
                case 3: row_dot_m(W, n, x, 3, 1, bits, half, wide, out); break;               \
                default: row_dot_m(W, n, x, 4, 1, bits, half, wide, out); break;              \
            }                                                                                 \
            return;                                                                           \
        }                                                                                     \
        switch (M) { /* R == rows_together(M) */                                              \
            case 1: row_dot_m(W, n, x, 1, 4, bits, half, wide, out); break;                   \
            case 2: row_dot_m(W, n, x, 2, 4, bits, half, wide, out); break;                   \
            case 3: row_dot_m(W, n, x, 3, 2, bits, half, wide, out); break;                   \
            default: row_dot_m(W, n, x, 4, 2, bits, half, wide, out); break;                  \
        }                                                                                     \
    }
ROW_DOT(row_dot_8_0, 8, 0, 0) ROW_DOT(row_dot_8_1, 8, 1, 0) ROW_DOT(row_dot_5_0, 5, 0, 0)
ROW_DOT(row_dot_5_1, 5, 1, 0) ROW_DOT(row_dot_4_0, 4, 0, 0) ROW_DOT(row_dot_4_1, 4, 1, 0)
#ifndef __AVXVNNI__
ROW_DOT(row_dot_8_0_wide, 8, 0, 1) ROW_DOT(row_dot_8_1_wide, 8, 1, 1)
#endif
#undef ROW_DOT

RowDot row_dot_for(const BlockMatrix* W) {
    const int h = W->half_scales != 0;
    switch (W->bits) {
        case 4: return h ? row_dot_4_1 : row_dot_4_0;
        case 5: return h ? row_dot_5_1 : row_dot_5_0;
        default:
#ifndef __AVXVNNI__
            if (W->B == 32) return h ? row_dot_8_1_wide : row_dot_8_0_wide;
#endif
            return h ? row_dot_8_1 : row_dot_8_0;
    }
}

/* Four accumulators at most: one activation row with four weight rows, two with two. */
int64_t rows_together(int64_t M) { return M <= 2 ? 4 : 2; }

void unpack_chunk(const BlockMatrix* W, int64_t n, int64_t c, int64_t len, uint8_t* out) {
    const int bits = (int)W->bits;
    const RowPtr p = row_ptr(W, n, bits);
    const __m256i packed = bits == 8 ? _mm256_setzero_si256()
                                     : _mm256_loadu_si256((const __m256i*)(p.q + c * p.q_step));
    for (int h = 0; h < len / 32; h++) {
        const __m256i w = bits == 8 ? half_weights(p, c, h, packed, 8)
                        : bits == 5 ? half_weights(p, c, h, packed, 5)
                                    : half_weights(p, c, h, packed, 4);
        _mm256_storeu_si256((__m256i*)(out + 32 * h), w);
    }
}
#endif

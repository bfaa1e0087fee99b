/* block_gemv.c's inner loop for AVX-512 (F, BW, VL), with or without VNNI (inferd).
 *
 * 64 weights of a row are one 512-bit vector of unsigned bytes s = q + zero; against the 64
 * activations' two int8 terms (block_layout.h), each int32 lane collects four products of each.
 * With VNNI one instruction (vpdpbusd) multiplies and adds four, the second term's starting from
 * -zero * (the four activations' sum), which removes the zero point inside the exact integer sum.
 * Without VNNI, see products. */
#include "block_layout.h"

#ifdef INFERD_ISA_AVX512
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

/* 64 stored weights of chunk c of a row, as unsigned bytes (`len` 64, or 32 at the end). */
static inline __attribute__((always_inline)) __m512i load_weights(RowPtr p, int64_t c,
                                                                  int64_t len, const int bits) {
    if (bits == 8) {
        if (len == 64) return _mm512_loadu_si512(p.q + c * p.q_step);
        return _mm512_maskz_loadu_epi8(0xFFFFFFFFULL, p.q + c * p.q_step);
    }
    const __m256i packed = _mm256_loadu_si256((const __m256i*)(p.q + c * p.q_step));
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i lo = _mm256_and_si256(packed, low4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
    __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    if (bits == 5) {
        uint64_t fifth;
        memcpy(&fifth, p.high + c * p.high_step, 8);
        w = _mm512_or_si512(w, _mm512_maskz_mov_epi8(fifth, _mm512_set1_epi8(16)));
    }
    return w;
}

/* The scales of a row's blocks in weights [k, k + len), spread over the 16 int32 lanes (lane i
 * belongs to block i / (B / 4) of the vector); `shift` is log2(B). Reads exactly those scales. */
static inline __attribute__((always_inline)) __m512 lane_scales(
    RowPtr p, int64_t k, const int64_t len, int shift, __m512i expand, const int half) {
    const int64_t first = k >> shift, count = len >> shift; /* 1, 2 or 4 */
    __m128 s;
    if (half) {
        /* fixed-size loads: a memcpy of a run-time size would be a byte loop here */
        const uint16_t* at = (const uint16_t*)p.scale + first;
        __m128i raw;
        if (count == 4) {
            raw = _mm_loadl_epi64((const __m128i*)at);
        } else if (count == 2) {
            int32_t two;
            memcpy(&two, at, 4);
            raw = _mm_cvtsi32_si128(two);
        } else {
            raw = _mm_cvtsi32_si128(*at);
        }
        s = _mm_cvtph_ps(raw);
    } else {
        const float* at = (const float*)p.scale + first;
        s = count == 4 ? _mm_loadu_ps(at)
          : count == 2 ? _mm_castpd_ps(_mm_load_sd((const double*)at))
                       : _mm_load_ss(at);
    }
    return _mm512_permutexvar_ps(expand, _mm512_castps128_ps512(s));
}

#ifndef __AVX512VNNI__
/* Per int32 lane, without VNNI: gain * the four products of the weights' integers and int8
 * activations a. vpmaddubsw (u8 x s8, pairs summed into int16), then vpmaddwd (pairs times gain
 * into int32). vpmaddubsw saturates at 32767: 4- and 5-bit weights (s < 32) x |a| <= 127 stay
 * far below, but 8-bit ones (s up to 255) would not. Those are recentred to q = s - 128 in
 * [-128, 127] and multiplied as |q| (unsigned, <= 128) by a with q's sign: a pair is at most
 * 2 * 128 * 127 = 32512, and the zero point is already gone (the caller leaves out c). */
static inline __attribute__((always_inline)) __m512i products(__m512i w, __m512i a,
                                                              const int bits, const int gain) {
    const __m512i g = _mm512_set1_epi16((short)gain);
    if (bits == 8) {
        const __m512i q = _mm512_xor_si512(w, _mm512_set1_epi8((char)0x80));
        const __m512i signed_a =
            _mm512_mask_sub_epi8(a, _mm512_movepi8_mask(q), _mm512_setzero_si512(), a);
        return _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(q), signed_a), g);
    }
    return _mm512_madd_epi16(_mm512_maddubs_epi16(w, a), g);
}
#endif

/* Per int32 lane: c + the four products of stored weights w and activations 256 a1 + a2
 * (block_layout.h). With VNNI one instruction (vpdpbusd) multiplies and adds four u8 x s8
 * products: one for a2 starting from c, which removes the zero point inside the exact integer
 * sum, one for a1, shifted by 8 bits. */
static inline __attribute__((always_inline)) __m512i dot4(__m512i c, __m512i w, __m512i a1,
                                                          __m512i a2, const int bits) {
#ifdef __AVX512VNNI__
    (void)bits;
    const __m512i high = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, a1);
    return _mm512_add_epi32(_mm512_dpbusd_epi32(c, w, a2),
                            _mm512_slli_epi32(high, RESIDUAL_SHIFT));
#else
    const __m512i p = _mm512_add_epi32(products(w, a1, bits, 1 << RESIDUAL_SHIFT),
                                       products(w, a2, bits, 1));
    return bits == 8 ? p : _mm512_add_epi32(c, p);
#endif
}

/* Weights [k, k + len) of R rows against M activation rows, into acc [M, R]. */
static inline __attribute__((always_inline)) void chunk_dot(
    const RowPtr* rp, QuantRows x, int64_t K, int64_t k, const int64_t len, int shift,
    __m512i expand, const int M, const int R, const int bits, const int half, __m512* acc) {
    __m512i w[4];
    __m512 s[4];
    UNROLL
    for (int r = 0; r < R; r++) {
        w[r] = load_weights(rp[r], k / 64, len, bits);
        s[r] = lane_scales(rp[r], k, len, shift, expand, half);
    }
    UNROLL
    for (int m = 0; m < M; m++) {
        const int8_t* xq = x.xq + m * K + k;
        const int8_t* xr = x.xr + m * K + k;
        const int32_t* xc = x.xc + m * (K / 4) + k / 4;
        const float* xl = x.xl + m * (K / 4) + k / 4;
        const __m512i a1 = len == 64 ? _mm512_loadu_si512(xq) : _mm512_maskz_loadu_epi8(~0U, xq);
        const __m512i a2 = len == 64 ? _mm512_loadu_si512(xr) : _mm512_maskz_loadu_epi8(~0U, xr);
        const __m512i c = len == 64 ? _mm512_loadu_si512(xc) : _mm512_maskz_loadu_epi32(0xFF, xc);
        const __m512 d = len == 64 ? _mm512_loadu_ps(xl) : _mm512_maskz_loadu_ps(0xFF, xl);
        UNROLL
        for (int r = 0; r < R; r++) {
            const __m512 p = _mm512_cvtepi32_ps(dot4(c, w[r], a1, a2, bits));
            acc[m * R + r] = _mm512_fmadd_ps(_mm512_mul_ps(s[r], d), p, acc[m * R + r]);
        }
    }
}

/* R weight rows (n, n+1, ...) against M activation rows. M, R, bits and half are compile-time
 * constants in each instantiation (see ROW_DOT), so the R x M accumulators live in registers,
 * independent FMA chains, and the loop has no branches on the layout. With one activation row
 * (decode of one sequence) four weight rows share each activation load. */
static inline __attribute__((always_inline)) void row_dot_m(
    const BlockMatrix* W, int64_t n, QuantRows x, const int M, const int R, const int bits,
    const int half, float* out /* [M, R] */) {
    const int64_t K = W->K;
    const int shift = W->B == 32 ? 5 : 4;
    const __m512i expand = W->B == 32
        ? _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0)
        : _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m512 acc[MAX_ROWS * 4];
    UNROLL
    for (int i = 0; i < M * R; i++) acc[i] = _mm512_setzero_ps();
    RowPtr rp[4];
    UNROLL
    for (int r = 0; r < R; r++) rp[r] = row_ptr(W, n + r, bits);
    /* NOTE: masked loads only for a last half chunk (K % 64 == 32): on an AMD EPYC with
     * AVX-512, masked 512-bit loads in this loop cut the bandwidth from memory to a third. */
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) chunk_dot(rp, x, K, k, 64, shift, expand, M, R, bits, half, acc);
    if (k < K) chunk_dot(rp, x, K, k, 32, shift, expand, M, R, bits, half, acc);
    UNROLL
    for (int i = 0; i < M * R; i++) out[i] = _mm512_reduce_add_ps(acc[i]);
}

#define ROW_DOT(bits, half)                                                                   \
    static void row_dot_##bits##_##half(const BlockMatrix* W, int64_t n, int64_t R,           \
                                        QuantRows x, int64_t M, float* out) {                 \
        if (R == 1) {                                                                         \
            switch (M) {                                                                      \
                case 1: row_dot_m(W, n, x, 1, 1, bits, half, out); break;                     \
                case 2: row_dot_m(W, n, x, 2, 1, bits, half, out); break;                     \
                case 3: row_dot_m(W, n, x, 3, 1, bits, half, out); break;                     \
                default: row_dot_m(W, n, x, 4, 1, bits, half, out); break;                    \
            }                                                                                 \
            return;                                                                           \
        }                                                                                     \
        switch (M) { /* R == rows_together(M) */                                              \
            case 1: row_dot_m(W, n, x, 1, 4, bits, half, out); break;                         \
            case 2: row_dot_m(W, n, x, 2, 4, bits, half, out); break;                         \
            case 3: row_dot_m(W, n, x, 3, 4, bits, half, out); break;                         \
            default: row_dot_m(W, n, x, 4, 4, bits, half, out); break;                        \
        }                                                                                     \
    }
ROW_DOT(8, 0) ROW_DOT(8, 1) ROW_DOT(5, 0) ROW_DOT(5, 1) ROW_DOT(4, 0) ROW_DOT(4, 1)
#undef ROW_DOT

RowDot row_dot_for(const BlockMatrix* W) {
    const int h = W->half_scales != 0;
    switch (W->bits) {
        case 4: return h ? row_dot_4_1 : row_dot_4_0;
        case 5: return h ? row_dot_5_1 : row_dot_5_0;
        default: return h ? row_dot_8_1 : row_dot_8_0;
    }
}

/* Four weight rows against up to four activation rows: 16 accumulators of the 32 registers. */
int64_t rows_together(int64_t M) {
    (void)M;
    return 4;
}

void unpack_chunk(const BlockMatrix* W, int64_t n, int64_t c, int64_t len, uint8_t* out) {
    const int bits = (int)W->bits;
    const RowPtr p = row_ptr(W, n, bits);
    const __m512i w = bits == 8 ? load_weights(p, c, len, 8)
                    : bits == 5 ? load_weights(p, c, len, 5)
                                : load_weights(p, c, len, 4);
    _mm512_mask_storeu_epi8(out, len == 64 ? ~0ULL : 0xFFFFFFFFULL, w);
}
#endif

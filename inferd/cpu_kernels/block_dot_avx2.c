/* block_gemv.c's tile for AVX2 (+ FMA, F16C), with AVX-VNNI where the build has it (inferd).
 *
 * A 256-bit vector holds half a unit of a group: 8 rows x 2 weights as int16, one int32 lane per
 * output row (a group is two such halves: rows 0-7 and 8-15). Against a broadcast pair of
 * 16-bit activations (block_layout.h), AVX-VNNI's vpdpwssd adds both products to each row's
 * int32 sum in one instruction; without it, vpmaddwd then vpaddd. Neither can saturate or
 * wrap: a pair is at most 2 * 128 * 32639 < 2^24, a block's sum (from -zero * its activations'
 * sum) stays within int32 (block_gemv.c). Unlike vpmaddubsw, which saturates int16 pair sums
 * (8-bit weights times int8 activations reach 2 * 255 * 127 > 32767), vpmaddwd needs no
 * recentring trick. At the end of each weight block the sums become floats once per row. */
#include "block_layout.h"

#ifdef INFERD_ISA_AVX2
#include <immintrin.h>

/* Loops over a tile's rows and halves are short and constant: unrolled, their accumulators
 * stay in registers (an array the compiler indexes at run time would live in memory). */
#ifdef INFERD_EMULATED_ISA
/* tests/emulated_isa.h: the intrinsics are SIMDe's C functions, for a test on a CPU without
 * this ISA. Unrolled and force-inlined, they took GCC minutes per file; the arithmetic is
 * the same either way. */
#define UNROLL
#define INLINE static inline
#else
#define UNROLL _Pragma("GCC unroll 16")
#define INLINE static inline __attribute__((always_inline))
#endif
#define MAX_ACC 8 /* rows x halves of a tile: one register each for their integer sums */

/* `bits` 0 in the functions below: the weights come from unpack_groups's buffer, one vector
 * per half unit (the group's int16 q, its zero point not removed), rather than from W->q. */
#define UNPACKED 0

/* Half h of a group's data: where its bytes of each unit or chunk are. */
typedef struct {
    const uint8_t* q;       /* the group's q, plus 16 h */
    const uint16_t* fifth;  /* 5 bits: the group's fifth bits, 16-bit words, plus h */
    const uint8_t* high2;   /* 6 bits: the group's high bits, plus 16 h */
    const __m256i* w;       /* UNPACKED: the half's unit u at w[u] */
    int64_t at;             /* its first scale: the group's, plus 8 h */
    int64_t sup;            /* factored: its first super-block factor, the group's plus 8 h */
    __m128i table;          /* CODED: the codebook, 16 int8 */
} Half;

INLINE Half half_of(const BlockMatrix* W, int64_t g, int h, const int bits, const __m256i* w) {
    Half p = {group_q(W, g) + 16 * h, NULL, NULL, w + h * (W->K / 2),
              group_scales(W, g) + 8 * h, group_supers(W, g) + 8 * h, _mm_setzero_si128()};
    if (bits == 5) p.fifth = (const uint16_t*)group_high(W, g) + h;
    if (bits == 6) p.high2 = group_high(W, g) + 16 * h;
    if (bits == CODED) p.table = _mm_loadu_si128((const __m128i*)W->codebook);
    return p;
}

/* 16 fifth bits (bit 2r + i) -> 16 int16 words, 16 where the bit is set, else 0. Each lane
 * keeps its own bit (an AND), then vpsignw turns what is left into 16 or 0: it gives its first
 * operand where the second is positive, minus it where negative, 0 where zero. Bit 15 makes
 * its lane negative (0x8000), so that lane's operand is -16. Two vector operations, where an
 * AND, a compare and another AND took three (a 4096 x 640 5-bit product of one row 0.142 ->
 * 0.125 ms, one thread, AMD EPYC Zen 3). */
INLINE __m256i fifth_words(const uint16_t* at) {
    uint16_t bits;
    memcpy(&bits, at, 2);
    const __m256i select = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024,
                                             2048, 4096, 8192, 16384, (short)0x8000);
    const __m256i sixteen = _mm256_setr_epi16(16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16,
                                              16, 16, 16, -16);
    return _mm256_sign_epi16(sixteen, _mm256_and_si256(_mm256_set1_epi16((short)bits), select));
}

/* s with the two high bits of unit pair k (0-3) of h (a byte of 6-bit high bits widened to
 * each int16 lane, block_layout.h) added at its bits 4-5: a shift, an AND, an add. */
INLINE __m256i with_high2(__m256i s, __m256i h, const int k) {
    const int shift = HIGH2_SHIFT(k);
    const __m256i at = shift < 0   ? _mm256_slli_epi16(h, -shift)
                       : shift > 0 ? _mm256_srli_epi16(h, shift)
                                   : h;
    return _mm256_add_epi16(s, _mm256_and_si256(at, _mm256_set1_epi16(0x30)));
}

/* The two half-units (lo, hi) of chunk c of block b (block_layout.h). */
INLINE void unit_pair(Half p, int64_t b, int64_t c, const int B, const int bits, __m256i* lo,
                      __m256i* hi) {
    const int64_t ulo = b * (B / 2) + c, uhi = ulo + B / 4;
    if (bits == UNPACKED) {
        *lo = _mm256_load_si256(p.w + ulo);
        *hi = _mm256_load_si256(p.w + uhi);
        return;
    }
    if (bits == 8) {
        *lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(p.q + 32 * ulo)));
        *hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(p.q + 32 * uhi)));
        return;
    }
    if (bits == CODED) { /* looked up as bytes (vpshufb), then sign-extended */
        const __m128i w = _mm_loadu_si128((const __m128i*)(p.q + 32 * (b * (B / 4) + c)));
        const __m128i nibble = _mm_set1_epi8(0x0F);
        *lo = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(p.table, _mm_and_si128(w, nibble)));
        *hi = _mm256_cvtepi8_epi16(
            _mm_shuffle_epi8(p.table, _mm_and_si128(_mm_srli_epi16(w, 4), nibble)));
        return;
    }
    const __m256i w =
        _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(p.q + 32 * (b * (B / 4) + c))));
    *lo = _mm256_and_si256(w, _mm256_set1_epi16(0x0F));
    *hi = _mm256_srli_epi16(w, 4);
    if (bits == 5) { /* the fifth bits of a unit: one uint32, this half's 16 of them */
        *lo = _mm256_add_epi16(*lo, fifth_words(p.fifth + 2 * ulo));
        *hi = _mm256_add_epi16(*hi, fifth_words(p.fifth + 2 * uhi));
    }
    if (bits == 6) { /* chunks c and c ^ 1 share these bytes: loaded once when unrolled */
        const __m256i h = _mm256_cvtepu8_epi16(
            _mm_loadu_si128((const __m128i*)(p.high2 + 32 * (b * (B / 8) + c / 2))));
        *lo = with_high2(*lo, h, 2 * (int)(c % 2));
        *hi = with_high2(*hi, h, 2 * (int)(c % 2) + 1);
    }
}

/* sum + the two products of each row's int16 pair w and the activation pair `pair` */
INLINE __m256i pair_dot(__m256i sum, __m256i w, __m256i pair) {
#ifdef __AVXVNNI__
    return _mm256_dpwssd_avx_epi32(sum, w, pair);
#else
    return _mm256_add_epi32(sum, _mm256_madd_epi16(w, pair));
#endif
}

/* NOTE: an empty asm that "changes" a sum ends its chain of additions here. Without it GCC
 * reassociates the integer additions of a whole unrolled weight block (they are exact, so it
 * may): it computed every vpmaddwd product of the block first, stored each one on the stack
 * and summed them afterwards, which ran the 8-row prefill tile at ~20% of vpmaddwd's peak on
 * an AMD EPYC (Zen 3). No instruction is emitted; the sums are the same integers. */
#ifdef INFERD_EMULATED_ISA /* an emulated vector may not fit a register */
INLINE void keep_in_register(__m256i* sum) { (void)sum; }
#else
INLINE void keep_in_register(__m256i* sum) { __asm__("" : "+x"(*sum)); }
#endif

/* The 8 rows' float scales of weight block b of half p: factored, super * sub (the scale:
 * block_layout.h's scale_at). */
INLINE __m256 factored(const void* sub, const float* super, int64_t at, int64_t sup) {
    const __m128i s = _mm_loadl_epi64((const __m128i*)((const int8_t*)sub + at));
    return _mm256_mul_ps(_mm256_loadu_ps(super + sup), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s)));
}

/* fp16 tested first: the scales of most types (Q4_0, Q5_0, Q8_0) */
INLINE __m256 block_scales(const BlockMatrix* W, Half p, int64_t b, const int B) {
    if (W->half_scales)
        return _mm256_cvtph_ps(
            _mm_loadu_si128((const __m128i*)((const uint16_t*)W->scale + p.at + b * GROUP)));
    if (W->scale_super)
        return factored(W->scale, W->scale_super, p.at + b * GROUP, p.sup + b * B / 256 * GROUP);
    return _mm256_loadu_ps((const float*)W->scale + p.at + b * GROUP);
}

INLINE __m256 block_offsets(const BlockMatrix* W, Half p, int64_t b, const int B) {
    if (W->offset_super)
        return factored(W->offset, W->offset_super, p.at + b * GROUP, p.sup + b * B / 256 * GROUP);
    return _mm256_loadu_ps((const float*)W->offset + p.at + b * GROUP);
}

/* R panel rows against HR halves of group g from half h0 (rows 16 g + 8 h0 ..). The R x HR
 * integer sums live in registers through a weight block, the float sums in acc (kept in memory
 * by the compiler where the 16 registers run out: an update per block). */
INLINE void tile(const BlockMatrix* W, int64_t g, int h0, Panel x, float* y, int64_t ldy,
                 const int bits, const int B, const int R, const int HR, const __m256i* w) {
    const int64_t K = W->K, nb = K / B;
    Half p[2];
    UNROLL
    for (int h = 0; h < HR; h++) p[h] = half_of(W, g, h0 + h, bits, w);
    __m256 acc[MAX_ACC];
    UNROLL
    for (int i = 0; i < R * HR; i++) acc[i] = _mm256_setzero_ps();
    const uint8_t *q = group_q(W, g), *high = bits == 5 || bits == 6 ? group_high(W, g) : NULL;
    /* NOTE: out of the loop: a division (by W->B) */
    const int size = scale_bytes(W);
    const char* scales = (const char*)W->scale + group_scales(W, g) * size;
    for (int64_t b = 0; b < nb; b++) {
        if (bits != UNPACKED) prefetch_block(q, high, scales, size, b, bits, B);
        __m256i s[MAX_ACC];
        UNROLL
        for (int m = 0; m < R; m++) {
            UNROLL
            for (int h = 0; h < HR; h++) s[m * HR + h] = _mm256_set1_epi32(x.zc[b * R + m]);
        }
        const int32_t* a = x.xw + b * (B / 2) * R; /* the block's first unit, row 0 */
        UNROLL
        for (int c = 0; c < B / 4; c++) {
            __m256i lo[2], hi[2];
            UNROLL
            for (int h = 0; h < HR; h++) unit_pair(p[h], b, c, B, bits, &lo[h], &hi[h]);
            UNROLL
            for (int m = 0; m < R; m++) {
                const __m256i alo = _mm256_set1_epi32(a[c * R + m]);
                const __m256i ahi = _mm256_set1_epi32(a[(c + B / 4) * R + m]);
                UNROLL
                for (int h = 0; h < HR; h++) {
                    s[m * HR + h] = pair_dot(pair_dot(s[m * HR + h], lo[h], alo), hi[h], ahi);
                    keep_in_register(&s[m * HR + h]);
                }
            }
        }
        UNROLL
        for (int h = 0; h < HR; h++) {
            const __m256 scale = block_scales(W, p[h], b, B);
            UNROLL
            for (int m = 0; m < R; m++) {
                const int i = m * HR + h;
                const __m256 d = _mm256_broadcast_ss(x.dx + b * B / XBLOCK * R + m);
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i]), _mm256_mul_ps(scale, d), acc[i]);
            }
            if (W->offset) {
                const __m256 o = block_offsets(W, p[h], b, B);
                UNROLL
                for (int m = 0; m < R; m++)
                    acc[m * HR + h] = _mm256_fmadd_ps(o, _mm256_broadcast_ss(x.xo + b * R + m),
                                                      acc[m * HR + h]);
            }
        }
    }
    UNROLL
    for (int h = 0; h < HR; h++) {
        const int64_t n0 = g * GROUP + 8 * (h0 + h), valid = W->N - n0 < 8 ? W->N - n0 : 8;
        const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)valid),
                                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        UNROLL
        for (int m = 0; m < R; m++) {
            if (valid == 8)
                _mm256_storeu_ps(y + m * ldy + n0, acc[m * HR + h]);
            else if (valid > 0)
                _mm256_maskstore_ps(y + m * ldy + n0, keep, acc[m * HR + h]);
        }
    }
}

/* Up to two rows against both halves at once; more, half by half. */
INLINE void product(const BlockMatrix* W, int64_t g, Panel x, int64_t R, float* y, int64_t ldy,
                    const int bits, const int B, const __m256i* w) {
    if (R <= 2) {
        if (R == 1) tile(W, g, 0, x, y, ldy, bits, B, 1, 2, w);
        else tile(W, g, 0, x, y, ldy, bits, B, 2, 2, w);
        return;
    }
    for (int h = 0; h < 2; h++) {
        if (g * GROUP + 8 * h >= W->N) break; /* padding only */
        switch (R) { /* the heights tile_rows gives */
            case 3: tile(W, g, h, x, y, ldy, bits, B, 3, 1, w); break;
            case 4: tile(W, g, h, x, y, ldy, bits, B, 4, 1, w); break;
            case 6: tile(W, g, h, x, y, ldy, bits, B, 6, 1, w); break;
            default: tile(W, g, h, x, y, ldy, bits, B, 8, 1, w); break;
        }
    }
}

/* 8 rows of integer sums in registers; fewer at the end of a call, in tiles that keep the
 * instantiations few. */
int64_t tile_rows(const BlockMatrix* W, int64_t left) {
    (void)W;
    static const int64_t heights[] = {8, 6, 4, 3, 2, 1};
    for (int i = 0;; i++)
        if (heights[i] <= left) return heights[i];
}

INLINE void product_of(int b16, const BlockMatrix* W, int64_t g, Panel x, int64_t R, float* y,
                       int64_t ldy, const int bits, const __m256i* w) {
    if (b16)
        product(W, g, x, R, y, ldy, bits, 16, w);
    else
        product(W, g, x, R, y, ldy, bits, 32, w);
}

static void group_product(const BlockMatrix* W, int64_t g, Panel x, int64_t R, float* y,
                          int64_t ldy, const __m256i* w) {
    if (w) { /* the weights' width no longer matters */
        product_of(W->B == 16, W, g, x, R, y, ldy, UNPACKED, w);
        return;
    }
    switch (q_format(W)) { /* it and B are constants in each instantiation: its loops unroll */
        case 4: product_of(W->B == 16, W, g, x, R, y, ldy, 4, NULL); break;
        case 5: product_of(W->B == 16, W, g, x, R, y, ldy, 5, NULL); break;
        case 6: product_of(W->B == 16, W, g, x, R, y, ldy, 6, NULL); break;
        case CODED: product_of(W->B == 16, W, g, x, R, y, ldy, CODED, NULL); break;
        default: product_of(W->B == 16, W, g, x, R, y, ldy, 8, NULL);
    }
}

int64_t tile_groups(int64_t M) {
    (void)M;
    return 1;
}

/* From this many rows an item unpacks its group once: the tiles then only load the weights
 * (for 5 bits, unpacking took ~13 vector operations per 32 products of 8 rows, beside the
 * products' 32). Never for 8 bits: there unpacking is one sign extension per vector, which the
 * load does anyway, and the tiles reading twice the bytes back from the scratch buffer made the
 * LM head (Q8_0) of 16 to 64 rows 1.1-1.25x slower (one thread, AMD EPYC Zen 3). */
#define UNPACK_FROM_ROWS 16

int64_t unpacked_bytes(const BlockMatrix* W, int64_t groups, int64_t M) {
    if (M < UNPACK_FROM_ROWS || W->bits == 8) return 0;
    return groups * 2 * (W->K / 2) * (int64_t)sizeof(__m256i);
}

/* One group's units as the tiles read them: half h's unit u at to[h K/2 + u]. */
static void unpack_group(const BlockMatrix* W, int64_t g, __m256i* to, const int bits,
                         const int B) {
    const int64_t units = W->K / 2;
    for (int h = 0; h < 2; h++) {
        const Half p = half_of(W, g, h, bits, NULL);
        for (int64_t b = 0; b < W->K / B; b++) {
            UNROLL
            for (int c = 0; c < B / 4; c++) {
                __m256i lo, hi;
                unit_pair(p, b, c, B, bits, &lo, &hi);
                _mm256_store_si256(to + h * units + b * (B / 2) + c, lo);
                _mm256_store_si256(to + h * units + b * (B / 2) + c + B / 4, hi);
            }
        }
    }
}

INLINE void unpack_group_of(int b16, const BlockMatrix* W, int64_t g, __m256i* to,
                            const int bits) {
    if (b16)
        unpack_group(W, g, to, bits, 16);
    else
        unpack_group(W, g, to, bits, 32);
}

void unpack_groups(const BlockMatrix* W, int64_t g, int64_t groups, void* to) {
    for (int64_t j = 0; j < groups; j++) {
        __m256i* w = (__m256i*)to + j * W->K;
        switch (q_format(W)) {
            case 4: unpack_group_of(W->B == 16, W, g + j, w, 4); break;
            case 5: unpack_group_of(W->B == 16, W, g + j, w, 5); break;
            case 6: unpack_group_of(W->B == 16, W, g + j, w, 6); break;
            case CODED: unpack_group_of(W->B == 16, W, g + j, w, CODED); break;
            default: unpack_group_of(W->B == 16, W, g + j, w, 8);
        }
    }
}

void tile_product(const BlockMatrix* W, int64_t g, int64_t groups, Panel x, int64_t R, float* y,
                  int64_t ldy, const void* unpacked) {
    for (int64_t j = 0; j < groups; j++)
        group_product(W, g + j, x, R, y, ldy,
                      unpacked ? (const __m256i*)unpacked + j * W->K : NULL);
}
#endif

/* block_gemv.c's tile for AVX-512 (F, BW, VL), with or without VNNI (inferd).
 *
 * A 512-bit vector holds one unit of a group: 16 rows x 2 weights as int16, one int32 lane per
 * output row. Against a broadcast pair of 16-bit activations (block_layout.h), vpdpwssd (VNNI)
 * adds both products to each row's int32 sum in one instruction; without VNNI, vpmaddwd then
 * vpaddd. Neither can saturate or wrap: a pair is at most 2 * 128 * 32639 < 2^24, a block's sum
 * (from -zero * its activations' sum) stays within int32 (block_gemv.c). At the end of each
 * weight block the 16 sums become floats once, for the 16 rows at a time. */
#include "block_layout.h"

#ifdef INFERD_ISA_AVX512
#include <immintrin.h>

/* Loops over a tile's rows and groups are short and constant: unrolled, their accumulators
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
#define MAX_ACC 24 /* rows x groups of a tile: one register each for their integer sums */

/* The two units (lo, hi) of chunk c of block b of a group: 8 bits, two loads sign-extended;
 * 4/5 bits, one load zero-extended, the nibbles split (and the fifth bits added). */
INLINE void unit_pair(const uint8_t* q, const uint8_t* high, int64_t b, int64_t c, const int B,
                      const int bits, __m512i* lo, __m512i* hi) {
    const int64_t ulo = b * (B / 2) + c, uhi = ulo + B / 4;
    if (bits == 8) {
        *lo = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(q + 32 * ulo)));
        *hi = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(q + 32 * uhi)));
        return;
    }
    const __m512i w = _mm512_cvtepu8_epi16(
        _mm256_loadu_si256((const __m256i*)(q + 32 * (b * (B / 4) + c))));
    *lo = _mm512_and_si512(w, _mm512_set1_epi16(0x0F));
    *hi = _mm512_srli_epi16(w, 4);
    if (bits == 5) {
        uint32_t flo, fhi; /* bit 2r + i: the fifth bit of the unit's word 2r + i */
        memcpy(&flo, high + 4 * ulo, 4);
        memcpy(&fhi, high + 4 * uhi, 4);
        const __m512i sixteen = _mm512_set1_epi16(16);
        *lo = _mm512_mask_add_epi16(*lo, _cvtu32_mask32(flo), *lo, sixteen);
        *hi = _mm512_mask_add_epi16(*hi, _cvtu32_mask32(fhi), *hi, sixteen);
    }
}

/* sum + the two products of each row's int16 pair w and the activation pair `pair` */
INLINE __m512i pair_dot(__m512i sum, __m512i w, __m512i pair) {
#ifdef __AVX512VNNI__
    return _mm512_dpwssd_epi32(sum, w, pair);
#else
    return _mm512_add_epi32(sum, _mm512_madd_epi16(w, pair));
#endif
}

/* NOTE: an empty asm that "changes" a sum ends its chain of additions here: without it GCC
 * reassociates the exact integer additions of a whole unrolled weight block (vpmaddwd then
 * vpaddd, no VNNI) and keeps every product on the stack until it sums them (block_dot_avx2.c
 * measured what that costs). No instruction is emitted; the sums are the same integers. */
#ifdef INFERD_EMULATED_ISA /* an emulated vector may not fit a register */
INLINE void keep_in_register(__m512i* sum) { (void)sum; }
#else
INLINE void keep_in_register(__m512i* sum) { __asm__("" : "+v"(*sum)); }
#endif

INLINE __m512 block_scales(const BlockMatrix* W, int64_t at) {
    if (W->half_scales)
        return _mm512_cvtph_ps(
            _mm256_loadu_si256((const __m256i*)((const uint16_t*)W->scale + at)));
    return _mm512_loadu_ps((const float*)W->scale + at);
}

/* R panel rows against GR groups from g. The R x GR integer sums live in registers through a
 * weight block; the float sums in acc (kept in memory by the compiler where registers run
 * out: an update per block). Each activation pair is broadcast once for the GR groups.
 * SPLIT: two integer sums per row and group (lo and hi units), for few rows, whose sums would
 * otherwise wait on each other. */
INLINE void tile(const BlockMatrix* W, int64_t g, Panel x, float* y, int64_t ldy, const int bits,
                 const int B, const int R, const int GR, const int SPLIT) {
    const int64_t K = W->K, nb = K / B;
    const uint8_t *q[2], *high[2];
    int64_t at[2];
    UNROLL
    for (int j = 0; j < GR; j++) {
        q[j] = group_q(W, g + j);
        high[j] = bits == 5 ? group_high(W, g + j) : NULL;
        at[j] = group_scales(W, g + j);
    }
    UNROLL
    for (int j = 0; j < GR; j++) prefetch_output(y, ldy, R, (g + j) * GROUP);
    __m512 acc[MAX_ACC];
    UNROLL
    for (int i = 0; i < R * GR; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        UNROLL
        for (int j = 0; j < GR; j++) prefetch_block(W, q[j], high[j], at[j], b, bits, B);
        __m512i s0[MAX_ACC], s1[MAX_ACC];
        UNROLL
        for (int m = 0; m < R; m++) {
            const __m512i start = _mm512_set1_epi32(x.zc[b * R + m]);
            UNROLL
            for (int j = 0; j < GR; j++) {
                s0[m * GR + j] = start;
                if (SPLIT) s1[m * GR + j] = _mm512_setzero_si512();
            }
        }
        const int32_t* a = x.xw + b * (B / 2) * R; /* the block's first unit, row 0 */
        UNROLL
        for (int c = 0; c < B / 4; c++) {
            __m512i lo[2], hi[2];
            UNROLL
            for (int j = 0; j < GR; j++) unit_pair(q[j], high[j], b, c, B, bits, &lo[j], &hi[j]);
            UNROLL
            for (int m = 0; m < R; m++) {
                const __m512i alo = _mm512_set1_epi32(a[c * R + m]);
                const __m512i ahi = _mm512_set1_epi32(a[(c + B / 4) * R + m]);
                UNROLL
                for (int j = 0; j < GR; j++) {
                    const int i = m * GR + j;
                    s0[i] = pair_dot(s0[i], lo[j], alo);
                    if (SPLIT)
                        s1[i] = pair_dot(s1[i], hi[j], ahi);
                    else
                        s0[i] = pair_dot(s0[i], hi[j], ahi);
                    keep_in_register(&s0[i]);
                    if (SPLIT) keep_in_register(&s1[i]);
                }
            }
        }
        __m512 scale[2];
        UNROLL
        for (int j = 0; j < GR; j++) scale[j] = block_scales(W, at[j] + b * GROUP);
        UNROLL
        for (int m = 0; m < R; m++) {
            const __m512 d = _mm512_set1_ps(x.dx[b * B / XBLOCK * R + m]);
            UNROLL
            for (int j = 0; j < GR; j++) {
                const int i = m * GR + j;
                const __m512i sum = SPLIT ? _mm512_add_epi32(s0[i], s1[i]) : s0[i];
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(scale[j], d),
                                         acc[i]);
            }
        }
        if (W->offset) {
            UNROLL
            for (int j = 0; j < GR; j++) {
                const __m512 o = _mm512_loadu_ps(W->offset + at[j] + b * GROUP);
                UNROLL
                for (int m = 0; m < R; m++)
                    acc[m * GR + j] = _mm512_fmadd_ps(o, _mm512_set1_ps(x.xo[b * R + m]),
                                                      acc[m * GR + j]);
            }
        }
    }
    UNROLL
    for (int j = 0; j < GR; j++) {
        const int64_t n0 = (g + j) * GROUP, valid = W->N - n0 < GROUP ? W->N - n0 : GROUP;
        const __mmask16 keep = (__mmask16)((1u << valid) - 1);
        UNROLL
        for (int m = 0; m < R; m++) _mm512_mask_storeu_ps(y + m * ldy + n0, keep, acc[m * GR + j]);
    }
}

INLINE void product(const BlockMatrix* W, int64_t g, int64_t groups, Panel x, int64_t R,
                    float* y, int64_t ldy, const int bits, const int B) {
    if (groups == 2) {
        switch (R) { /* the heights tile_rows gives */
            case 1: tile(W, g, x, y, ldy, bits, B, 1, 2, 1); return;
            case 2: tile(W, g, x, y, ldy, bits, B, 2, 2, 1); return;
            case 3: tile(W, g, x, y, ldy, bits, B, 3, 2, 0); return;
            case 4: tile(W, g, x, y, ldy, bits, B, 4, 2, 0); return;
            case 6: tile(W, g, x, y, ldy, bits, B, 6, 2, 0); return;
            case 8: tile(W, g, x, y, ldy, bits, B, 8, 2, 0); return;
            default: tile(W, g, x, y, ldy, bits, B, 12, 2, 0); return;
        }
    }
    switch (R) { /* one group: calls of up to 4 rows, or the last of an odd count */
        case 1: tile(W, g, x, y, ldy, bits, B, 1, 1, 1); break;
        case 2: tile(W, g, x, y, ldy, bits, B, 2, 1, 1); break;
        case 3: tile(W, g, x, y, ldy, bits, B, 3, 1, 1); break;
        case 4: tile(W, g, x, y, ldy, bits, B, 4, 1, 1); break;
        case 6: tile(W, g, x, y, ldy, bits, B, 6, 1, 0); break;
        case 8: tile(W, g, x, y, ldy, bits, B, 8, 1, 0); break;
        default: tile(W, g, x, y, ldy, bits, B, 12, 1, 0); break;
    }
}

/* 12 rows of integer sums for two groups in registers, their float sums in memory; or, for the
 * formats with offsets (Q4_K, Q5_K: one more FMA per row, group and block), 6 rows with both
 * kinds of sums in registers: the float sums' round trip through memory at every block end cost
 * those more than the 12 rows' fewer weight unpackings save (one thread on the Zen 5 AMD EPYC,
 * scripts/bench_block_kernels.py: Q4_K products 1.05-1.08x faster from 16 rows on, the other
 * formats no faster). With 8 rows or fewer left, the same heights for every format (a call of
 * 8 rows is one 8-row tile of one group at a time, its sums all in registers), in tiles that keep
 * the instantiations few. */
int64_t tile_rows(const BlockMatrix* W, int64_t left) {
    static const int64_t twelve[] = {12, 8, 6, 4, 3, 2, 1}, six[] = {6, 4, 3, 2, 1};
    const int64_t* heights = W->offset && left > 8 ? six : twelve;
    for (int i = 0;; i++)
        if (heights[i] <= left) return heights[i];
}

/* Two groups per tile share each activation broadcast; but a step of a few rows is bound by
 * reading the weights from memory, which one stream at a time keeps fastest (on an AMD EPYC
 * with AVX-512, one thread: the LM head at 8 rows took half the time with one group). */
int64_t tile_groups(int64_t M) { return M <= 8 ? 1 : 2; }

INLINE void product_of(int b16, const BlockMatrix* W, int64_t g, int64_t groups, Panel x,
                       int64_t R, float* y, int64_t ldy, const int bits) {
    if (b16)
        product(W, g, groups, x, R, y, ldy, bits, 16);
    else
        product(W, g, groups, x, R, y, ldy, bits, 32);
}

void tile_product(const BlockMatrix* W, int64_t g, int64_t groups, Panel x, int64_t R, float* y,
                  int64_t ldy, const void* unpacked) {
    (void)unpacked;
    switch (W->bits) { /* bits and B are constants in each instantiation: its loops unroll */
        case 4: product_of(W->B == 16, W, g, groups, x, R, y, ldy, 4); break;
        case 5: product_of(W->B == 16, W, g, groups, x, R, y, ldy, 5); break;
        default: product_of(W->B == 16, W, g, groups, x, R, y, ldy, 8);
    }
}
#endif

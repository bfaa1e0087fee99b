/* What block_gemv.c shares with its per-ISA inner loops (block_dot_*.c): where a weight's bytes
 * are, the ISA this build targets, and the row-dot signature. Internal: not part of the C ABI. */
#ifndef INFERD_BLOCK_LAYOUT_H
#define INFERD_BLOCK_LAYOUT_H
#include <stdint.h>
#include <string.h>

#include "kernels.h"

/* Exactly one ISA per build, from the target flags build.py passes (variants.py):
 * AVX-512 needs F, BW and VL; AVX2 needs FMA and F16C; anything else is the portable C. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define INFERD_ISA_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define INFERD_ISA_AVX2 1
#else
#define INFERD_ISA_PORTABLE 1
#endif

#define XBLOCK 32 /* activation quantisation block */
/* Rows of x handled per pass over a tile of weight rows (block_gemv.c), their accumulators in
 * registers: AVX-512 takes four weight rows at once (16 accumulators of 32 registers), AVX2
 * fewer (rows_together). More activation rows are further passes over the tile, in L1 by then:
 * on an AMD EPYC with AVX-512, passes of 4 took half the time of passes of 8 (with 2 weight
 * rows) or of single weight rows, for 5 to 16 activation rows. */
#define MAX_ROWS 4
/* Weight rows a thread takes at a time: a multiple of every rows_together() value */
#define TILE 4

/* Where the `bytes` bytes of chunk c (weights 64c ...) of row n start, in an array holding
 * `bytes` bytes per 64 weights of every row. */
static inline int64_t chunk_at(const BlockMatrix* W, int64_t n, int64_t c, int64_t bytes) {
    if (W->interleaved) return ((n >> 2) * (W->K / 64) + c) * 4 * bytes + (n & 3) * bytes;
    return n * (W->K * bytes / 64) + c * bytes;
}

static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else if (exp) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man) { /* subnormal: normalise */
        exp = 113;
        while (!(man & 0x400)) man <<= 1, exp--;
        bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float scale_at(const BlockMatrix* W, int64_t i) {
    return W->half_scales ? half_to_float(((const uint16_t*)W->scale)[i])
                          : ((const float*)W->scale)[i];
}

/* The activations of a product, quantised by block_gemv.c for every ISA alike (it describes
 * the arithmetic): per block of 32, d = absmax / 127 and each value x = (d / 256) * (256 q1 + q2)
 * to within d / 512, with q1 and q2 int8, |q1|, |q2| <= 127. Rows of [M, K]:
 *   xq: q1;  xr: q2;  xw: 256 q1 + q2 as int16 (for the ISAs that multiply 16-bit activations,
 *   WIDE_ACTIVATIONS; else NULL);
 *   per group of four (one int32 lane of a dot-product instruction) xl [M, K/4] the block's
 *   d / 256 and xc [M, K/4] = -zero * (the four 256 q1 + q2), which removes the weights' zero
 *   point inside the exact integer sums. */
typedef struct {
    const int8_t* xq;
    const int8_t* xr;
    const int16_t* xw;
    const int32_t* xc;
    const float* xl;
} QuantRows;

#define RESIDUAL_SHIFT 8 /* q2 counts in steps of 1 / 256 of q1's */
#if defined(INFERD_ISA_PORTABLE) || (defined(INFERD_ISA_AVX2) && !defined(__AVXVNNI__))
#define WIDE_ACTIVATIONS 1 /* the inner loop multiplies int16 activations (some or all types) */
#endif

/* out [M, R] = the scaled block sums of weight rows n .. n+R-1 against M activation rows
 * (offsets excluded). R is 1 or rows_together(M). */
typedef void (*RowDot)(const BlockMatrix* W, int64_t n, int64_t R, QuantRows x, int64_t M,
                       float* out);

#define INTERNAL __attribute__((visibility("hidden"))) /* not exported from the library */

/* Each ISA's file defines these three (block_dot_avx512.c, block_dot_avx2.c,
 * block_dot_portable.c); the others compile to nothing. */
INTERNAL RowDot row_dot_for(const BlockMatrix* W);
/* weight rows per row_dot call for M activation rows: as many as the registers allow */
INTERNAL int64_t rows_together(int64_t M);
/* the stored (unsigned) bytes of chunk c of row n: 64 of them, or 32 for a last half chunk */
INTERNAL void unpack_chunk(const BlockMatrix* W, int64_t n, int64_t c, int64_t len,
                           uint8_t* out);

#endif

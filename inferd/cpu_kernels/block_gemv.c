/* Matrix-vector products over weights kept in GGUF's block quantisation (inferd, `--quantization
 * gguf`). Built once per machine by cpu_kernels/build.py and called through ctypes.
 *
 * Weights: small integers q with one scale per block of B weights along the input (B = 32, or
 * 16 for Q6_K/Q3_K/Q2_K) and, for the types that have one, one float offset per block:
 *     w[n, k] = scale[n, k/B] * q[n, k] + offset[n, k/B].
 * Every GGUF type converts to this form without changing a single weight value. q is stored
 * unsigned, as s = q + zero (zero: one constant per matrix), in one of three widths, picked from
 * the values' range so that the bytes read per token stay close to the GGUF file's:
 *   8 bits: one byte per weight (zero = 128);
 *   4 bits: 64 weights in 32 bytes, byte j holding weight j (low nibble) and j + 32 (high);
 *   5 bits: the 4-bit layout plus one 64-bit word of fifth bits per 64 weights.
 * Scales are fp16 where that is exact (Q8_0, Q5_0, Q4_0 scales are fp16 in the file), else fp32.
 * With `interleaved` (N a multiple of 4, K of 64), the bytes of each chunk of 64 weights of rows
 * 4i..4i+3 follow each other ([N/4, K/64, 4, chunk bytes]): a decode step reads four rows at
 * once, and this keeps its reads sequential, which the hardware prefetcher needs.
 *
 * Activations: llama.cpp quantises each row of x to int8 in blocks of 32 (scale d = absmax /
 * 127) for the same products, which moves each activation by up to d / 2: on a small model that
 * flips a few percent of the next-token argmaxes against float32. Here each activation is two
 * int8 terms instead, x = (d / 256) * (256 q1 + q2), q2 holding q1's rounding residual: within
 * d / 512, 16-bit activations. The block dot products are exact integer sums (AVX-512 VNNI: 64
 * multiply-adds per instruction, two instructions per 64 weights for the two terms, against the
 * same weight bytes), so a product still reads little more than the weight bytes: decode on a
 * CPU is bound by memory bandwidth, and this keeps it there.
 *
 *   y[m, n] = sum_b scale[n, b] * dx[m, b*B/32] * dot(s_b - zero, 256 q1_b + q2_b)
 *           + sum_b offset[n, b] * xsum[m, b]      (dx: d / 256; xsum: exact float sums)
 * (|s - zero| <= 255 and |256 q1 + q2| <= 32639: a lane's four products fit in int32.)
 *
 * The inner loop over a row's blocks is written once per ISA (block_dot_avx512.c: AVX-512 with or
 * without VNNI; block_dot_avx2.c: AVX2 with or without AVX-VNNI; block_dot_portable.c: plain C);
 * build.py compiles one library per ISA variant and loads the best one the CPU runs. This file
 * is what they share: the activations' quantisation, the threads, the offsets, dequantisation.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "block_layout.h"

/* The ISA variant this library was compiled for (build.py checks it is the one it asked for). */
const char* inferd_kernel_isa(void) {
#if defined(INFERD_ISA_AVX512) && defined(__AVX512VNNI__)
    return "avx512-vnni";
#elif defined(INFERD_ISA_AVX512)
    return "avx512";
#elif defined(INFERD_ISA_AVX2) && defined(__AVXVNNI__)
    return "avx2-vnni";
#elif defined(INFERD_ISA_AVX2)
    return "avx2";
#else
    return "portable";
#endif
}

/* x [M, K] -> the QuantRows buffers (block_layout.h), and xs [M, K/B] the exact float sums per
 * weight block (for the offsets). NOTE: tests/unit/test_gguf_blocks.py repeats this arithmetic
 * in PyTorch bit for bit: f = x * (1 / d); q1 = rint(f); q2 = rint((f - q1) * 256) (f - q1 is
 * exact in float32), clamped to +-127 (it reaches 128 only at exact ties). */
static void quantize_rows(const float* x, int64_t M, int64_t K, int64_t B, int64_t zero,
                          int8_t* xq, int8_t* xr, int16_t* xw, float* xl, int32_t* xc,
                          float* xs) {
    /* Plain loops the compiler vectorises: a step of one row spends as long here as in the
     * products of a small matrix. */
    const float step = (float)(1 << RESIDUAL_SHIFT);
    for (int64_t m = 0; m < M; m++) {
        const float* xrow = x + m * K;
        int8_t *q1 = xq + m * K, *q2 = xr + m * K;
        for (int64_t b = 0; b < K / XBLOCK; b++) {
            const float* v = xrow + b * XBLOCK;
            float amax = 0.0f;
#pragma omp simd reduction(max : amax)
            for (int j = 0; j < XBLOCK; j++) {
                const float a = fabsf(v[j]);
                amax = a > amax ? a : amax;
            }
            const float d = amax / 127.0f;
            const float inv = d > 0.0f ? 1.0f / d : 0.0f;
            for (int j = 0; j < XBLOCK / 4; j++) xl[m * (K / 4) + b * (XBLOCK / 4) + j] = d / step;
            int32_t hi[XBLOCK], lo[XBLOCK];
#pragma omp simd
            for (int j = 0; j < XBLOCK; j++) {
                const float f = v[j] * inv, q = rintf(f), r = rintf((f - q) * step);
                hi[j] = (int32_t)q;
                lo[j] = (int32_t)(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r);
            }
            for (int j = 0; j < XBLOCK; j++) {
                q1[b * XBLOCK + j] = (int8_t)hi[j];
                q2[b * XBLOCK + j] = (int8_t)lo[j];
            }
        }
        for (int64_t b = 0; b < K / B; b++) {
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int j = 0; j < B; j++) s += xrow[b * B + j];
            xs[m * (K / B) + b] = s;
        }
        if (xw) {
#pragma omp simd
            for (int64_t k = 0; k < K; k++)
                xw[m * K + k] = (int16_t)((int32_t)q1[k] * (1 << RESIDUAL_SHIFT) + q2[k]);
        }
#pragma omp simd
        for (int64_t g = 0; g < K / 4; g++) {
            const int8_t *a = q1 + 4 * g, *r = q2 + 4 * g;
            const int32_t sum = ((int32_t)a[0] + a[1] + a[2] + a[3]) * (1 << RESIDUAL_SHIFT) +
                                r[0] + r[1] + r[2] + r[3];
            xc[m * (K / 4) + g] = (int32_t)(-zero) * sum;
        }
    }
}

/* y [M, ldy] (columns 0..N-1) = x [M, K] . w^T. Returns 0, -1 if the layout is not supported
 * (K not a multiple of 32, or of 64 for 4/5 bits; B not 16 or 32), -2 if out of memory. */
int inferd_block_gemv(const float* x, int64_t M, const BlockMatrix* W, float* y, int64_t ldy) {
    const int64_t K = W->K, B = W->B, nb = K / B;
    if (K % XBLOCK || (B != 16 && B != 32) || M < 1 || (W->bits != 8 && K % 64)) return -1;
#ifdef WIDE_ACTIVATIONS
    const int64_t wide = 1;
#else
    const int64_t wide = 0;
#endif
    int8_t* xq = malloc((size_t)(M * K * (2 + 2 * wide))); /* q1, q2, then 256 q1 + q2 */
    float* xl = malloc(sizeof(float) * (size_t)(M * K / 4));
    float* xs = malloc(sizeof(float) * (size_t)(M * nb));
    int32_t* xc = malloc(sizeof(int32_t) * (size_t)(M * K / 4));
    if (!xq || !xl || !xs || !xc) {
        free(xq); free(xl); free(xs); free(xc);
        return -2;
    }
    int8_t* xr = xq + M * K;
    int16_t* xw = wide ? (int16_t*)(xq + 2 * M * K) : NULL;
    quantize_rows(x, M, K, B, W->zero, xq, xr, xw, xl, xc, xs);
    const RowDot row_dot = row_dot_for(W);
    /* Each thread takes tiles of TILE weight rows and runs every activation row against a tile
     * (MAX_ROWS at a time) before the next tile: the tile comes from memory once and stays in
     * L1 for the other passes, so a step of many rows costs arithmetic, not re-reading the
     * matrix once per MAX_ROWS rows. */
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < (W->N + TILE - 1) / TILE; t++) {
        const int64_t n0 = t * TILE, tile = W->N - n0 < TILE ? W->N - n0 : TILE;
        float part[MAX_ROWS * TILE];
        for (int64_t m0 = 0; m0 < M; m0 += MAX_ROWS) {
            const int64_t rows = M - m0 < MAX_ROWS ? M - m0 : MAX_ROWS;
            const int64_t group = rows_together(rows); /* weight rows per kernel call */
            const int64_t R = tile < group ? 1 : group;
            const QuantRows xm0 = {xq + m0 * K, xr + m0 * K, xw ? xw + m0 * K : NULL,
                                   xc + m0 * (K / 4), xl + m0 * (K / 4)};
            for (int64_t r0 = 0; r0 < tile; r0 += R) {
                row_dot(W, n0 + r0, R, xm0, rows, part);
                for (int64_t r = 0; r < R; r++) {
                    const int64_t n = n0 + r0 + r;
                    for (int64_t m = 0; m < rows; m++) {
                        float v = part[m * R + r];
                        if (W->offset) {
                            const float* on = W->offset + n * nb;
                            const float* xsm = xs + (m0 + m) * nb;
                            float o = 0.0f;
#pragma omp simd reduction(+ : o)
                            for (int64_t b = 0; b < nb; b++) o += on[b] * xsm[b];
                            v += o;
                        }
                        y[(m0 + m) * ldy + n] = v;
                    }
                }
            }
        }
    }
    free(xq); free(xl); free(xs); free(xc);
    return 0;
}

static inline uint16_t float_to_bf16(float f) { /* round to nearest even, as PyTorch does */
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((bits >> 16) | 0x40); /* NaN */
    return (uint16_t)((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

/* out [rows, K] = weight rows first .. first+rows-1 (scale * q + offset), as float32, or
 * bfloat16 with `bf16`: what a step with many rows multiplies by with PyTorch's GEMM (a slab of
 * rows at a time where no copy is kept, so the slab is still in cache when the GEMM reads it).
 * The loops over a row are plain C that the compiler vectorises for the variant's ISA. */
void inferd_block_dequantize(const BlockMatrix* W, int64_t first, int64_t rows, int64_t bf16,
                             void* out) {
    const int64_t K = W->K, B = W->B, nb = K / B;
    const float zero = (float)W->zero;
#pragma omp parallel
    {
        float* row = malloc(sizeof(float) * (size_t)K);
        uint8_t stored[64];
#pragma omp for schedule(static)
        for (int64_t n = first; n < first + rows; n++) {
            if (!row) continue;
            for (int64_t k = 0; k < K; k += 64) {
                const int64_t len = K - k >= 64 ? 64 : 32;
                unpack_chunk(W, n, k / 64, len, stored);
                for (int64_t j = 0; j < len; j++) row[k + j] = (float)stored[j] - zero;
            }
            for (int64_t b = 0; b < nb; b++) {
                const float s = scale_at(W, n * nb + b);
                const float o = W->offset ? W->offset[n * nb + b] : 0.0f;
                float* v = row + b * B;
                for (int64_t j = 0; j < B; j++) v[j] = s * v[j] + o;
            }
            if (bf16) {
                uint16_t* o = (uint16_t*)out + (n - first) * K;
                for (int64_t k = 0; k < K; k++) o[k] = float_to_bf16(row[k]);
            } else {
                memcpy((float*)out + (n - first) * K, row, sizeof(float) * (size_t)K);
            }
        }
        free(row);
    }
}

/* Products with weights kept in GGUF's block quantisation (inferd, the default mode on CPU for a
 * GGUF file). Built once per machine by cpu_kernels/build.py and called through ctypes.
 *
 * Weights: small integers q with one scale per block of B weights along the input (B = 32, or
 * 16 for Q6_K/Q3_K/Q2_K) and, for the types that have one, one float offset per block:
 *     w[n, k] = scale[n, k/B] * q[n, k] + offset[n, k/B].
 * Every GGUF type converts to this form without changing a single weight value. q is stored in
 * one of four widths, picked from the values' range so that the bytes read per token stay
 * close to the GGUF file's: 8 bits (q itself, int8), or 4, 5 and 6 bits (s = q + zero, zero
 * one constant per matrix; 5 and 6 bits: 4 of them as for 4, the others apart); or, for a type
 * whose q take at most 16 values (a codebook), 4-bit indexes into a table of those values.
 * Scales are fp16 where that is exact, else fp32; a K-quant's scales and offsets are stored
 * factored as the file has them, a float per 256 inputs times an int8 per block, whose product
 * is exact in float32: the same scale, in fewer bytes.
 *
 * Layout: lanes are output rows. The rows are in groups of 16 (the last padded with zeros: the
 * product never writes them), and per group, for each pair of inputs (2u, 2u + 1), a "unit" of
 * the 16 rows' two weights side by side: one 32-bit lane per row, so that a vector of 16 int32
 * lanes (AVX-512; AVX2 takes a group as two halves of 8) multiplies 16 rows by one broadcast
 * pair of activations (block_layout.h has the byte offsets). The group's block scales (and
 * offsets) are 16 contiguous values per block. gguf_blocks.py builds this layout.
 *
 * Activations: llama.cpp quantises each row of x to int8 in blocks of 32 (d = absmax / 127) for
 * the same products, which moves each activation by up to d / 2: on a small model that flips a
 * few percent of the next-token argmaxes against float32. Here each activation is two int8
 * terms, x ~ (d / 256) * a with a = 256 q1 + q2 (q2 holding q1's rounding residual): within
 * d / 512, a 16-bit integer. Per output n, activation row m and weight block b, the integer sum
 *     isum = sum_{k in b} q[n, k] * a[m, k]
 * is exact in int32 (vpdpwssd, or vpmaddwd + vpaddd: one int32 lane per row, a pair of products
 * each; |q| <= 128 and |a| <= 32639 over B <= 32 inputs; 4/5/6-bit weights multiply s <= 63 and
 * start the sum from -zero * (the block's sum of a), which removes the zero point: below 2^28),
 * and each output then takes, for b = 0, 1, ... in order, the same IEEE float operations:
 *     acc = fma(float(isum), scale[n, b] * dx[m, b], acc)       (dx = d / 256)
 *     acc = fma(offset[n, b], float(sum_{k in b} a[m, k]) * dx[m, b], acc)   (if offsets)
 * and y[m, n] = acc. NOTE: that sequence is the numeric definition. Every ISA variant performs
 * it (the portable C with fmaf), and nothing in it depends on how many rows share the call, on
 * which tile or thread computes a row, or on the vector width: a row's outputs are the same bits
 * alone or in any batch, and the same in every variant (tests/unit/test_block_invariance.py).
 * (The offsets multiply the quantised activations' exact sums, not a float sum of x, whose
 * order would depend on the vector width.)
 *
 * Each ISA's tile (block_dot_avx512.c, block_dot_avx2.c, block_dot_portable.c) keeps the
 * integer sums of several activation rows against one or two groups in registers, so each
 * unpacked weight vector serves all of them, as in a GEMM; the activations of a tile's rows are
 * packed side by side (a panel, block_layout.h) so that one pointer reaches them all. build.py
 * compiles one library per ISA variant and loads the best the CPU runs. This file is what they
 * share: the activations' quantisation, the threads, dequantisation.
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

/* Where the rows of a call are: tile t holds rows start[t] .. start[t] + rows[t] - 1, and its
 * panel (block_layout.h) is at offset start[t] * (per-row size) in each array. */
typedef struct {
    int64_t count;
    int64_t* start;
    int64_t* rows;
} Tiles;

/* Row j of a panel of R rows (block_layout.h) from xrow [K]. NOTE: tests/unit/test_gguf_blocks.py
 * repeats this arithmetic in PyTorch bit for bit: f = x * (1 / d); q1 = rint(f);
 * q2 = rint((f - q1) * 256) (f - q1 is exact in float32), clamped to +-127 (it reaches 128 only
 * at exact ties). Only IEEE operations whose result does not depend on the vector width (max,
 * division, rint, exact integer sums), so every variant gets the same bits. */
static void quantize_row(const float* xrow, int64_t K, int64_t B, int64_t zero, int64_t j,
                         int64_t R, Panel out) {
    int32_t* xw = (int32_t*)out.xw;
    float *dx = (float*)out.dx, *xo = (float*)out.xo;
    int32_t* zc = (int32_t*)out.zc;
    const float step = (float)(1 << RESIDUAL_SHIFT);
    for (int64_t blk = 0; blk < K / XBLOCK; blk++) {
        const float* v = xrow + blk * XBLOCK;
        float amax = 0.0f;
#pragma omp simd reduction(max : amax)
        for (int i = 0; i < XBLOCK; i++) {
            const float t = fabsf(v[i]);
            amax = t > amax ? t : amax;
        }
        const float d = amax / 127.0f;
        const float inv = d > 0.0f ? 1.0f / d : 0.0f;
        dx[blk * R + j] = d / step;
        int16_t a[XBLOCK];
#pragma omp simd
        for (int i = 0; i < XBLOCK; i++) {
            const float f = v[i] * inv, q = rintf(f), r = rintf((f - q) * step);
            const float q2 = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
            a[i] = (int16_t)((int32_t)q * (1 << RESIDUAL_SHIFT) + (int32_t)q2);
        }
        for (int64_t u = 0; u < XBLOCK / 2; u++) {
            int32_t pair; /* a[2u] in the low half, as a vector lane of int16 pairs reads it */
            memcpy(&pair, a + 2 * u, 4);
            xw[(blk * XBLOCK / 2 + u) * R + j] = pair;
        }
        for (int64_t b = blk * XBLOCK / B; b < (blk + 1) * XBLOCK / B; b++) {
            int32_t sum = 0;
            for (int64_t i = b * B - blk * XBLOCK; i < (b + 1) * B - blk * XBLOCK; i++) sum += a[i];
            zc[b * R + j] = (int32_t)(-zero) * sum;
            /* |sum| <= 32 * 32639 < 2^24: exact as a float */
            if (xo) xo[b * R + j] = (float)sum * (d / step);
        }
    }
}

/* Rows of a call per work item besides its group, so that both threads work when a matrix
 * has few groups: a multiple of every variant's largest tile (tile_rows). */
#define ROW_CHUNK 96

/* Whether the kernels run W's layout: K a multiple of 32 (of 256 with factored scales or
 * offsets), B 16 or 32, bits 4, 5, 6 or 8 (5 and 6 with their high bits), a codebook only for
 * 4-bit indexes (zero 0), factored scales of int8 (not fp16). */
static int supported(const BlockMatrix* W) {
    const int64_t K = W->K, bits = W->bits;
    const int factored = W->scale_super || W->offset_super;
    return K > 0 && K % XBLOCK == 0 && (W->B == 16 || W->B == 32) &&
           (bits == 4 || bits == 5 || bits == 6 || bits == 8) &&
           (bits == 4 || bits == 8 || W->high) && (!W->codebook || (bits == 4 && !W->zero)) &&
           (!factored || K % 256 == 0) && (!W->offset_super || W->offset) &&
           (!W->scale_super || !W->half_scales);
}

/* y [M, ldy] (columns 0..N-1) = x [M, K] . w^T. Returns 0, -1 if the layout is not supported
 * (`supported`, or M < 1, ldy < N), -2 if out of memory. */
int inferd_block_gemv(const float* x, int64_t M, const BlockMatrix* W, float* y, int64_t ldy) {
    const int64_t K = W->K, B = W->B, N = W->N, nb = K / B;
    if (!supported(W) || M < 1 || N < 0 || ldy < N) return -1;
    if (N == 0) return 0;
    /* one buffer: the tiles' starts and rows, then xw [M, K/2] int32, dx [M, K/32], zc and xo
     * [M, nb] */
    const size_t values = (size_t)(M * (K / 2 + K / XBLOCK + 2 * nb));
    char* buffer = malloc(16 * (size_t)M + 4 * values);
    if (!buffer) return -2;
    Tiles tiles = {0, (int64_t*)buffer, (int64_t*)buffer + M};
    int32_t* xw = (int32_t*)(tiles.rows + M);
    float* dx = (float*)(xw + M * (K / 2));
    int32_t* zc = (int32_t*)(dx + M * (K / XBLOCK));
    float* xo = (float*)(zc + M * nb);
    for (int64_t m = 0; m < M; m += tiles.rows[tiles.count - 1]) {
        tiles.start[tiles.count] = m;
        tiles.rows[tiles.count++] = tile_rows(W, M - m);
    }
#pragma omp parallel for schedule(static) if (M * K >= 1 << 16)
    for (int64_t t = 0; t < tiles.count; t++) {
        const int64_t m0 = tiles.start[t], R = tiles.rows[t];
        const Panel panel = {xw + m0 * (K / 2), dx + m0 * (K / XBLOCK), zc + m0 * nb,
                             W->offset ? xo + m0 * nb : NULL};
        for (int64_t j = 0; j < R; j++) quantize_row(x + (m0 + j) * K, K, B, W->zero, j, R, panel);
    }
    const int64_t G = (N + GROUP - 1) / GROUP, per_item = tile_groups(M);
    const int64_t items = (G + per_item - 1) / per_item, chunks = (M + ROW_CHUNK - 1) / ROW_CHUNK;
    /* Where the variant asks for it, a thread unpacks its groups' weights once for all the
     * tiles of its items (without that scratch, as when it cannot be allocated, the tiles
     * unpack as they go). */
    const int64_t scratch = (unpacked_bytes(W, per_item, M) + 63) / 64 * 64;
    /* NOTE: a thread takes groups and runs a chunk of rows against them, tile by tile,
     * consecutive work items sharing the groups (their weights stay in cache). Which thread,
     * chunk, tile or group it falls in changes nothing in a row's arithmetic. */
#pragma omp parallel
    {
        void* unpacked = scratch ? aligned_alloc(64, (size_t)scratch) : NULL;
        int64_t unpacked_g = -1; /* the first group in `unpacked` */
#pragma omp for schedule(static)
        for (int64_t item = 0; item < items * chunks; item++) {
            const int64_t g = item / chunks * per_item, first = item % chunks * ROW_CHUNK;
            const int64_t groups = G - g < per_item ? G - g : per_item;
            if (unpacked && unpacked_g != g) {
                unpack_groups(W, g, groups, unpacked);
                unpacked_g = g;
            }
            for (int64_t t = 0; t < tiles.count; t++) {
                const int64_t m0 = tiles.start[t];
                if (m0 < first || m0 >= first + ROW_CHUNK) continue;
                const Panel panel = {xw + m0 * (K / 2), dx + m0 * (K / XBLOCK), zc + m0 * nb,
                                     W->offset ? xo + m0 * nb : NULL};
                tile_product(W, g, groups, panel, tiles.rows[t], y + m0 * ldy, ldy, unpacked);
            }
        }
        free(unpacked);
    }
    free(buffer);
    return 0;
}

static inline uint16_t float_to_bf16(float f) { /* round to nearest even, as PyTorch does */
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((bits >> 16) | 0x40); /* NaN */
    return (uint16_t)((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

/* out [rows, K] = weight rows first .. first+rows-1 (scale * q + offset), as float32, or
 * bfloat16 with `bf16`. A group at a time: its units unpacked once for all its rows. */
void inferd_block_dequantize(const BlockMatrix* W, int64_t first, int64_t rows, int64_t bf16,
                             void* out) {
    const int64_t K = W->K, B = W->B, nb = K / B;
    if (rows <= 0) return;
    const int64_t g_first = first / GROUP, g_last = (first + rows - 1) / GROUP;
#pragma omp parallel
    {
        int16_t* q = malloc(sizeof(int16_t) * (size_t)(GROUP * K)); /* [K/2 units, 16, 2] */
        float* row = malloc(sizeof(float) * (size_t)K);
#pragma omp for schedule(static)
        for (int64_t g = g_first; g <= g_last; g++) {
            if (!q || !row) continue;
            for (int64_t u = 0; u < K / 2; u++) unpack_unit(W, g, u, q + 32 * u);
            const int64_t lo = g * GROUP > first ? g * GROUP : first;
            const int64_t hi = (g + 1) * GROUP < first + rows ? (g + 1) * GROUP : first + rows;
            for (int64_t n = lo; n < hi; n++) {
                const int r = (int)(n - g * GROUP);
                for (int64_t b = 0; b < nb; b++) {
                    const int64_t at = block_at(W, g, b) + r, sup = super_at(W, g, b) + r;
                    const float s = scale_at(W, at, sup), o = offset_at(W, at, sup);
                    for (int64_t k = b * B; k < (b + 1) * B; k++)
                        row[k] = s * (float)q[32 * (k / 2) + 2 * r + k % 2] + o;
                }
                if (bf16) {
                    uint16_t* o = (uint16_t*)out + (n - first) * K;
                    for (int64_t k = 0; k < K; k++) o[k] = float_to_bf16(row[k]);
                } else {
                    memcpy((float*)out + (n - first) * K, row, sizeof(float) * (size_t)K);
                }
            }
        }
        free(q);
        free(row);
    }
}

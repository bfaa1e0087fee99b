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
 * Activations: each row of x is quantised to int8 in blocks of 32 (scale = absmax / 127), as
 * llama.cpp does for the same products. The block dot products are then exact integer sums
 * (AVX-512 VNNI: 64 multiply-adds per instruction), so a product reads little more than the
 * weight bytes: decode on a CPU is bound by memory bandwidth, and this keeps it there.
 *
 *   y[m, n] = sum_b scale[n, b] * dx[m, b*B/32] * dot(s_b - zero, xq_b)
 *           + sum_b offset[n, b] * xsum[m, b]      (dx: activation scales; xsum: exact sums)
 *
 * VNNI multiplies unsigned by signed bytes; the zero point is removed inside the integer sums, by
 * starting each int32 lane at -zero * (the sum of its four activations).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AVX512VL__)
#include <immintrin.h>
#define INFERD_VNNI 1
#endif

#define XBLOCK 32  /* activation quantisation block */
#define MAX_ROWS 8 /* rows of x handled per pass over the weights */
/* weight rows per kernel call for M activation rows: as many as the registers allow */
#define ROWS_TOGETHER(M) ((M) <= 2 ? 4 : (M) <= 4 ? 2 : 1)

const char* inferd_kernel_isa(void) {
#ifdef INFERD_VNNI
    return "avx512-vnni";
#else
    return "portable";
#endif
}

static float half_to_float(uint16_t h) {
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

/* x [M, K] -> xq [M, K] int8; per group of four activations (one VNNI lane), xl [M, K/4] its
 * block's scale and xc [M, K/4] = -zero * (sum of the four xq); xs [M, K/B] float sums per
 * weight block (for the offsets). */
static void quantize_rows(const float* x, int64_t M, int64_t K, int64_t B, int64_t zero,
                          int8_t* xq, float* xl, int32_t* xc, float* xs) {
    for (int64_t m = 0; m < M; m++) {
        const float* xr = x + m * K;
        for (int64_t b = 0; b < K / XBLOCK; b++) {
            const float* v = xr + b * XBLOCK;
            float amax = 0.0f;
            for (int j = 0; j < XBLOCK; j++) amax = fmaxf(amax, fabsf(v[j]));
            const float d = amax / 127.0f;
            const float inv = d > 0.0f ? 1.0f / d : 0.0f;
            for (int j = 0; j < XBLOCK / 4; j++) xl[m * (K / 4) + b * (XBLOCK / 4) + j] = d;
            for (int j = 0; j < XBLOCK; j++) xq[m * K + b * XBLOCK + j] = (int8_t)lrintf(v[j] * inv);
        }
        for (int64_t b = 0; b < K / B; b++) {
            float s = 0.0f;
            for (int j = 0; j < B; j++) s += xr[b * B + j];
            xs[m * (K / B) + b] = s;
        }
        for (int64_t k = 0; k < K; k += 4) {
            const int8_t* v = xq + m * K + k;
            xc[m * (K / 4) + k / 4] = (int32_t)(-zero) * ((int32_t)v[0] + v[1] + v[2] + v[3]);
        }
    }
}

/* Where the `bytes` bytes of chunk c (weights 64c ...) of row n start, in an array holding
 * `bytes` bytes per 64 weights of every row. */
static inline int64_t chunk_at(const BlockMatrix* W, int64_t n, int64_t c, int64_t bytes) {
    if (W->interleaved) return ((n >> 2) * (W->K / 64) + c) * 4 * bytes + (n & 3) * bytes;
    return n * (W->K * bytes / 64) + c * bytes;
}

/* The stored (unsigned) value of weight k of row n. */
static inline int32_t stored_at(const BlockMatrix* W, int64_t n, int64_t k) {
    const int64_t c = k / 64, j = k % 64;
    if (W->bits == 8) return W->q[chunk_at(W, n, c, 64) + j];
    const uint8_t byte = W->q[chunk_at(W, n, c, 32) + j % 32];
    int32_t s = j < 32 ? byte & 0xF : byte >> 4;
    if (W->bits == 5) s |= ((W->high[chunk_at(W, n, c, 8) + j / 8] >> (j % 8)) & 1) << 4;
    return s;
}

#ifdef INFERD_VNNI
/* Where one row's chunks are: its first chunk in q (and high), and the distance between chunks
 * (4 chunks apart when interleaved), so the inner loop only adds. */
typedef struct {
    const uint8_t *q, *high;
    int64_t q_step, high_step;
} RowPtr;

static inline RowPtr row_ptr(const BlockMatrix* W, int64_t n, int bits) {
    const int64_t cb = bits == 8 ? 64 : 32, group = W->interleaved ? 4 : 1;
    RowPtr p = {W->q + chunk_at(W, n, 0, cb), NULL, cb * group, 8 * group};
    if (bits == 5) p.high = W->high + chunk_at(W, n, 0, 8);
    return p;
}

/* 64 stored weights of chunk c of a row, as unsigned bytes (`len` 64, or 32 at the end). */
static inline __attribute__((always_inline)) __m512i load_weights(RowPtr p, int64_t c,
                                                                  int64_t len, const int bits) {
    if (bits == 8) {
        const __mmask64 bytes = len == 64 ? ~0ULL : 0xFFFFFFFFULL;
        return _mm512_maskz_loadu_epi8(bytes, p.q + c * p.q_step);
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

/* The scales of the blocks in weights [k, k + len) of row n, spread over the 16 int32 lanes
 * (lane i belongs to block i / (B / 4) of the vector). */
static inline __attribute__((always_inline)) __m512 lane_scales(
    const BlockMatrix* W, int64_t n, int64_t k, int64_t len, __m512i expand, const int half) {
    const int64_t first = n * (W->K / W->B) + k / W->B;
    const __mmask8 blocks = (__mmask8)((1u << (len / W->B)) - 1);
    const __m128 s = half
        ? _mm_cvtph_ps(_mm_maskz_loadu_epi16(blocks, (const uint16_t*)W->scale + first))
        : _mm_maskz_loadu_ps(blocks, (const float*)W->scale + first);
    return _mm512_permutexvar_ps(expand, _mm512_castps128_ps512(s));
}

/* R weight rows (n, n+1, ...) against M activation rows. M, R, bits and half are compile-time
 * constants in each instantiation (see ROW_DOT), so the R x M accumulators live in registers,
 * independent FMA chains, and the loop has no branches on the layout. With one activation row
 * (decode of one sequence) four weight rows share each activation load. */
static inline __attribute__((always_inline)) void row_dot_m(
    const BlockMatrix* W, int64_t n, const int8_t* xq, const int32_t* xc, const float* xl,
    const int M, const int R, const int bits, const int half, float* out /* [M, R] */) {
    const int64_t K = W->K;
    const __m512i expand = W->B == 32
        ? _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0)
        : _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m512 acc[MAX_ROWS * 4];
    for (int i = 0; i < M * R; i++) acc[i] = _mm512_setzero_ps();
    RowPtr rp[4];
    for (int r = 0; r < R; r++) rp[r] = row_ptr(W, n + r, bits);
    for (int64_t k = 0; k < K; k += 64) {
        const int64_t len = K - k >= 64 ? 64 : 32; /* K % 32 == 0 */
        const __mmask64 bytes = len == 64 ? ~0ULL : 0xFFFFFFFFULL;
        const __mmask16 lanes = len == 64 ? 0xFFFF : 0x00FF;
        __m512i w[4];
        __m512 s[4];
        for (int r = 0; r < R; r++) {
            w[r] = load_weights(rp[r], k / 64, len, bits);
            s[r] = lane_scales(W, n + r, k, len, expand, half);
        }
        for (int m = 0; m < M; m++) {
            const __m512i a = _mm512_maskz_loadu_epi8(bytes, xq + m * K + k);
            const __m512i c = _mm512_maskz_loadu_epi32(lanes, xc + m * (K / 4) + k / 4);
            const __m512 d = _mm512_maskz_loadu_ps(lanes, xl + m * (K / 4) + k / 4);
            for (int r = 0; r < R; r++) {
                const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(c, w[r], a));
                acc[m * R + r] = _mm512_fmadd_ps(_mm512_mul_ps(s[r], d), p, acc[m * R + r]);
            }
        }
    }
    for (int i = 0; i < M * R; i++) out[i] = _mm512_reduce_add_ps(acc[i]);
}

#define ROW_DOT(bits, half)                                                                   \
    static void row_dot_##bits##_##half(const BlockMatrix* W, int64_t n, int64_t R,           \
                                        const int8_t* xq, const int32_t* xc, const float* xl, \
                                        int64_t M, float* out) {                               \
        if (R == 1) {                                                                           \
            switch (M) {                                                                        \
                case 1: row_dot_m(W, n, xq, xc, xl, 1, 1, bits, half, out); break;              \
                case 2: row_dot_m(W, n, xq, xc, xl, 2, 1, bits, half, out); break;              \
                case 3: row_dot_m(W, n, xq, xc, xl, 3, 1, bits, half, out); break;              \
                case 4: row_dot_m(W, n, xq, xc, xl, 4, 1, bits, half, out); break;              \
                case 5: row_dot_m(W, n, xq, xc, xl, 5, 1, bits, half, out); break;              \
                case 6: row_dot_m(W, n, xq, xc, xl, 6, 1, bits, half, out); break;              \
                case 7: row_dot_m(W, n, xq, xc, xl, 7, 1, bits, half, out); break;              \
                default: row_dot_m(W, n, xq, xc, xl, 8, 1, bits, half, out); break;             \
            }                                                                                   \
            return;                                                                             \
        }                                                                                       \
        switch (M) { /* R == ROWS_TOGETHER(M) */                                                \
            case 1: row_dot_m(W, n, xq, xc, xl, 1, 4, bits, half, out); break;                  \
            case 2: row_dot_m(W, n, xq, xc, xl, 2, 4, bits, half, out); break;                  \
            case 3: row_dot_m(W, n, xq, xc, xl, 3, 2, bits, half, out); break;                  \
            default: row_dot_m(W, n, xq, xc, xl, 4, 2, bits, half, out); break;                 \
        }                                                                                       \
    }
ROW_DOT(8, 0) ROW_DOT(8, 1) ROW_DOT(5, 0) ROW_DOT(5, 1) ROW_DOT(4, 0) ROW_DOT(4, 1)
#undef ROW_DOT

typedef void (*RowDot)(const BlockMatrix*, int64_t, int64_t, const int8_t*, const int32_t*,
                       const float*, int64_t, float*);

static RowDot row_dot_for(const BlockMatrix* W) {
    const int h = W->half_scales != 0;
    switch (W->bits) {
        case 4: return h ? row_dot_4_1 : row_dot_4_0;
        case 5: return h ? row_dot_5_1 : row_dot_5_0;
        default: return h ? row_dot_8_1 : row_dot_8_0;
    }
}
#else
/* The same sums without VNNI (any CPU): exact integer block sums, then the scales. */
static void row_dot(const BlockMatrix* W, int64_t n0, int64_t R, const int8_t* xq,
                    const int32_t* xc, const float* xl, int64_t M, float* out) {
    (void)xc;
    const int64_t K = W->K, B = W->B;
    for (int64_t m = 0; m < M; m++)
        for (int64_t r = 0; r < R; r++) {
            const int64_t n = n0 + r;
            float t = 0.0f;
            for (int64_t b = 0; b < K / B; b++) {
                int32_t s = 0;
                for (int64_t j = 0; j < B; j++)
                    s += (stored_at(W, n, b * B + j) - (int32_t)W->zero) * xq[m * K + b * B + j];
                t += scale_at(W, n * (K / B) + b) * xl[m * (K / 4) + b * B / 4] * (float)s;
            }
            out[m * R + r] = t;
        }
}

typedef void (*RowDot)(const BlockMatrix*, int64_t, int64_t, const int8_t*, const int32_t*,
                       const float*, int64_t, float*);

static RowDot row_dot_for(const BlockMatrix* W) {
    (void)W;
    return row_dot;
}
#endif

/* y [M, ldy] (columns 0..N-1) = x [M, K] . w^T. Returns 0, -1 if the layout is not supported
 * (K not a multiple of 32, or of 64 for 4/5 bits; B not 16 or 32), -2 if out of memory. */
int inferd_block_gemv(const float* x, int64_t M, const BlockMatrix* W, float* y, int64_t ldy) {
    const int64_t K = W->K, B = W->B, nb = K / B;
    if (K % XBLOCK || (B != 16 && B != 32) || M < 1 || (W->bits != 8 && K % 64)) return -1;
    int8_t* xq = malloc((size_t)(M * K));
    float* xl = malloc(sizeof(float) * (size_t)(M * K / 4));
    float* xs = malloc(sizeof(float) * (size_t)(M * nb));
    int32_t* xc = malloc(sizeof(int32_t) * (size_t)(M * K / 4));
    if (!xq || !xl || !xs || !xc) {
        free(xq); free(xl); free(xs); free(xc);
        return -2;
    }
    quantize_rows(x, M, K, B, W->zero, xq, xl, xc, xs);
    const RowDot row_dot = row_dot_for(W);
    for (int64_t m0 = 0; m0 < M; m0 += MAX_ROWS) {
        const int64_t rows = M - m0 < MAX_ROWS ? M - m0 : MAX_ROWS;
        const int64_t group = ROWS_TOGETHER(rows); /* weight rows per kernel call */
#pragma omp parallel for schedule(static)
        for (int64_t g = 0; g < (W->N + group - 1) / group; g++) {
            const int64_t n0 = g * group, R = W->N - n0 < group ? 1 : group;
            float part[MAX_ROWS * 4];
            for (int64_t r0 = 0; r0 < (W->N - n0 < group ? W->N - n0 : group); r0 += R) {
                row_dot(W, n0 + r0, R, xq + m0 * K, xc + m0 * (K / 4), xl + m0 * (K / 4), rows,
                        part);
                for (int64_t r = 0; r < R; r++) {
                    const int64_t n = n0 + r0 + r;
                    for (int64_t m = 0; m < rows; m++) {
                        float t = part[m * R + r];
                        if (W->offset) {
                            const float* on = W->offset + n * nb;
                            const float* xm = xs + (m0 + m) * nb;
                            float o = 0.0f;
#pragma omp simd reduction(+ : o)
                            for (int64_t b = 0; b < nb; b++) o += on[b] * xm[b];
                            t += o;
                        }
                        y[(m0 + m) * ldy + n] = t;
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

/* out [N, K] = the weights (scale * q + offset), as float32, or bfloat16 with `bf16`: what a
 * step with many rows multiplies by with PyTorch's GEMM. */
void inferd_block_dequantize(const BlockMatrix* W, int64_t bf16, void* out) {
    const int64_t K = W->K, nb = K / W->B;
#pragma omp parallel
    {
        float* row = malloc(sizeof(float) * (size_t)K);
#pragma omp for schedule(static)
        for (int64_t n = 0; n < W->N; n++) {
            if (!row) continue;
#ifdef INFERD_VNNI
            const int bits = (int)W->bits;
            const RowPtr p = row_ptr(W, n, bits);
            for (int64_t k = 0; k < K; k += 64) {
                const int64_t len = K - k >= 64 ? 64 : 32;
                __m512i w = bits == 8 ? load_weights(p, k / 64, len, 8)
                          : bits == 5 ? load_weights(p, k / 64, len, 5)
                                      : load_weights(p, k / 64, len, 4);
                uint8_t stored[64];
                _mm512_storeu_si512(stored, w);
                for (int64_t j = 0; j < len; j++) row[k + j] = (float)((int32_t)stored[j] - W->zero);
            }
#else
            for (int64_t k = 0; k < K; k++) row[k] = (float)(stored_at(W, n, k) - W->zero);
#endif
            for (int64_t b = 0; b < nb; b++) {
                const float s = scale_at(W, n * nb + b);
                const float o = W->offset ? W->offset[n * nb + b] : 0.0f;
                float* v = row + b * W->B;
                for (int64_t j = 0; j < W->B; j++) v[j] = s * v[j] + o;
            }
            if (bf16) {
                uint16_t* o = (uint16_t*)out + n * K;
                for (int64_t k = 0; k < K; k++) o[k] = float_to_bf16(row[k]);
            } else {
                memcpy((float*)out + n * K, row, sizeof(float) * (size_t)K);
            }
        }
        free(row);
    }
}

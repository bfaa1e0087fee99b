/* Matrix-vector products over weights kept in GGUF's block quantisation (inferd, `--quantization
 * gguf`). Built once per machine by cpu_kernels/build.py and called through ctypes.
 *
 * Weights: one unsigned byte per weight, u = q + 128, with one float scale per block of B weights
 * along the input (B = 32, or 16 for Q6_K/Q3_K/Q2_K) and, for the types that have one, one float
 * offset per block:   w[n, k] = scale[n, k/B] * (u[n, k] - 128) + offset[n, k/B].
 * Every GGUF type converts to this form without changing a single weight value.
 *
 * Activations: each row of x is quantised to int8 in blocks of 32 (scale = absmax / 127), as
 * llama.cpp does for the same products. The block dot products are then exact integer sums
 * (AVX-512 VNNI: 64 multiply-adds per instruction), so a product reads little more than the
 * weight bytes: decode on a CPU is bound by memory bandwidth, and this keeps it there.
 *
 *   y[m, n] = sum_b scale[n, b] * dx[m, b*B/32] * dot(u_b - 128, xq_b)
 *           + sum_b offset[n, b] * xsum[m, b]      (dx: activation scales; xsum: exact sums)
 *
 * VNNI multiplies unsigned by signed bytes, hence u = q + 128; the shift is removed inside the
 * integer sums, by starting each int32 lane at -128 * (the sum of its four activations).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define INFERD_VNNI 1
#endif

#define XBLOCK 32  /* activation quantisation block */
#define MAX_ROWS 8 /* rows of x handled per pass over the weights */

const char* inferd_kernel_isa(void) {
#ifdef INFERD_VNNI
    return "avx512-vnni";
#else
    return "portable";
#endif
}

/* x [M, K] -> xq [M, K] int8; per group of four activations (one VNNI lane), xl [M, K/4] its
 * block's scale and xc [M, K/4] = -128 * (sum of the four xq); xs [M, K/B] float sums per
 * weight block (for the offsets). */
static void quantize_rows(const float* x, int64_t M, int64_t K, int64_t B, int8_t* xq, float* xl,
                          int32_t* xc, float* xs) {
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
            xc[m * (K / 4) + k / 4] = -128 * ((int32_t)v[0] + v[1] + v[2] + v[3]);
        }
    }
}

#ifdef INFERD_VNNI
/* One weight row against up to MAX_ROWS quantised activation rows. Each 64-byte vector holds
 * 64 / B weight blocks; VNNI leaves the sums of each block in B / 4 int32 lanes, which are scaled
 * in float by (weight scale * activation scale) of their block; one horizontal sum at the end.
 * xl holds each lane's activation scale, so only the weight scales need spreading over lanes. */
static inline __m512 lane_sums(__m512i w, __m512 s, const int8_t* xq, const int32_t* xc,
                               const float* xl, __mmask64 bytes, __mmask16 lanes, __m512 acc) {
    const __m512i a = _mm512_maskz_loadu_epi8(bytes, xq);
    const __m512i c = _mm512_maskz_loadu_epi32(lanes, xc);
    const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(c, w, a));
    return _mm512_fmadd_ps(_mm512_mul_ps(s, _mm512_maskz_loadu_ps(lanes, xl)), p, acc);
}

/* M is a compile-time constant in each instantiation (see row_dot), so the accumulators live in
 * registers; two per row, alternating vectors, so consecutive FMAs do not wait on each other. */
static inline __attribute__((always_inline)) void row_dot_m(
    const uint8_t* u, const float* scale, const int8_t* xq, const int32_t* xc, const float* xl,
    const int M, int64_t K, int64_t B, float* out) {
    /* lane i of a vector belongs to block i / (B / 4) of it */
    const __m512i expand = B == 32
        ? _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0)
        : _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __mmask8 blocks = B == 32 ? 0x3 : 0xF;
    __m512 acc[MAX_ROWS][2];
    for (int m = 0; m < M; m++) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
        const int h = (int)(k / 64) & 1;
        const __m512i w = _mm512_loadu_si512(u + k);
        const __m512 s = _mm512_permutexvar_ps(
            expand, _mm512_castps128_ps512(_mm_maskz_loadu_ps(blocks, scale + k / B)));
        for (int m = 0; m < M; m++)
            acc[m][h] = lane_sums(w, s, xq + m * K + k, xc + m * (K / 4) + k / 4,
                                  xl + m * (K / 4) + k / 4, ~0ULL, 0xFFFF, acc[m][h]);
    }
    if (k < K) { /* a last half vector: 32 weights */
        const __mmask64 bytes = 0xFFFFFFFFULL;
        const __m512i w = _mm512_maskz_loadu_epi8(bytes, u + k);
        const __m512 s = _mm512_permutexvar_ps(expand, _mm512_castps128_ps512(
            _mm_maskz_loadu_ps((__mmask8)((1u << (32 / B)) - 1), scale + k / B)));
        for (int m = 0; m < M; m++)
            acc[m][0] = lane_sums(w, s, xq + m * K + k, xc + m * (K / 4) + k / 4,
                                  xl + m * (K / 4) + k / 4, bytes, 0x00FF, acc[m][0]);
    }
    for (int m = 0; m < M; m++) out[m] = _mm512_reduce_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]));
}

static void row_dot(const uint8_t* u, const float* scale, const int8_t* xq, const int32_t* xc,
                    const float* xl, int64_t M, int64_t K, int64_t B, float* out /* [M] */) {
    switch (M) {
#define ROWS(n) case n: row_dot_m(u, scale, xq, xc, xl, n, K, B, out); break;
        ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8)
#undef ROWS
    }
}
#else
/* The same sums without VNNI (any CPU): exact integer block sums, then the scales. */
static void row_dot(const uint8_t* u, const float* scale, const int8_t* xq, const int32_t* xc,
                    const float* xl, int64_t M, int64_t K, int64_t B, float* out) {
    (void)xc;
    for (int64_t m = 0; m < M; m++) {
        float t = 0.0f;
        for (int64_t b = 0; b < K / B; b++) {
            int32_t s = 0;
            for (int64_t j = 0; j < B; j++)
                s += ((int32_t)u[b * B + j] - 128) * xq[m * K + b * B + j];
            t += scale[b] * xl[m * (K / 4) + b * B / 4] * (float)s;
        }
        out[m] = t;
    }
}
#endif

/* y [M, N] = x [M, K] . w^T, w as described at the top. offset may be NULL. Returns 0, or -1 if
 * the shapes are not supported (K not a multiple of 32, B not 16 or 32). */
int inferd_block_gemv(const float* x, int64_t M, int64_t K, const uint8_t* u, const float* scale,
                      const float* offset, int64_t N, int64_t B, float* y) {
    if (K % XBLOCK || (B != 16 && B != 32) || M < 1) return -1;
    const int64_t nb = K / B;
    int8_t* xq = malloc((size_t)(M * K));
    float* xl = malloc(sizeof(float) * (size_t)(M * K / 4));
    float* xs = malloc(sizeof(float) * (size_t)(M * nb));
    int32_t* xc = malloc(sizeof(int32_t) * (size_t)(M * K / 4));
    if (!xq || !xl || !xs || !xc) {
        free(xq); free(xl); free(xs); free(xc);
        return -2;
    }
    quantize_rows(x, M, K, B, xq, xl, xc, xs);
    for (int64_t m0 = 0; m0 < M; m0 += MAX_ROWS) {
        const int64_t rows = M - m0 < MAX_ROWS ? M - m0 : MAX_ROWS;
        const int8_t* xq0 = xq + m0 * K;
        const int32_t* xc0 = xc + m0 * (K / 4);
#pragma omp parallel for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            float part[MAX_ROWS];
            row_dot(u + n * K, scale + n * nb, xq0, xc0, xl + m0 * (K / 4), rows, K, B, part);
            for (int64_t m = 0; m < rows; m++) {
                float t = part[m];
                if (offset) {
                    const float* on = offset + n * nb;
                    const float* xm = xs + (m0 + m) * nb;
                    for (int64_t b = 0; b < nb; b++) t += on[b] * xm[b];
                }
                y[(m0 + m) * N + n] = t;
            }
        }
    }
    free(xq); free(xl); free(xs); free(xc);
    return 0;
}

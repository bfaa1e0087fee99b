/* Sums whose order is fixed in the source (inferd): the reductions of decode_attention.c, which
 * must give a row the same bits whatever else a step holds. A reduction left to the compiler
 * (`omp simd reduction`, -ffast-math) may start its vector lanes wherever the data's address is
 * aligned and combine them in any order; these name their lanes: lane l takes the elements l,
 * l + LANES, ..., then a fixed tree combines the lanes. -std=c11 rules out contraction into
 * FMAs (build.py), so vector and scalar code give the same bits. */
#ifndef INFERD_FIXED_ORDER_H
#define INFERD_FIXED_ORDER_H
#include <stdint.h>
#include <string.h>

#define LANES 16 /* accumulators of a dot product or a sum */

static inline float tree(float* lane) {
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) lane[l] += lane[l + w];
    return lane[0];
}

static inline float dot(const float* restrict a, const float* restrict b, int64_t D) {
    float lane[LANES] = {0};
    int64_t d = 0;
    for (; d + LANES <= D; d += LANES)
        for (int l = 0; l < LANES; l++) lane[l] += a[d + l] * b[d + l];
    for (int l = 0; d + l < D; l++) lane[l] += a[d + l] * b[d + l];
    return tree(lane);
}

/* Four of `dot` at once (four query heads against one key, which is loaded once): the same
 * operations per score. */
static inline void dot4(const float* restrict q, const float* restrict k, int64_t D, float* s) {
    float l0[LANES] = {0}, l1[LANES] = {0}, l2[LANES] = {0}, l3[LANES] = {0};
    const float *q0 = q, *q1 = q + D, *q2 = q + 2 * D, *q3 = q + 3 * D;
    int64_t d = 0;
    for (; d + LANES <= D; d += LANES)
        for (int l = 0; l < LANES; l++) {
            const float x = k[d + l];
            l0[l] += q0[d + l] * x, l1[l] += q1[d + l] * x;
            l2[l] += q2[d + l] * x, l3[l] += q3[d + l] * x;
        }
    for (int l = 0; d + l < D; l++) {
        const float x = k[d + l];
        l0[l] += q0[d + l] * x, l1[l] += q1[d + l] * x;
        l2[l] += q2[d + l] * x, l3[l] += q3[d + l] * x;
    }
    s[0] = tree(l0), s[1] = tree(l1), s[2] = tree(l2), s[3] = tree(l3);
}

static inline float sum(const float* restrict x, int64_t n) {
    float lane[LANES] = {0};
    int64_t t = 0;
    for (; t + LANES <= n; t += LANES)
        for (int l = 0; l < LANES; l++) lane[l] += x[t + l];
    for (int l = 0; t + l < n; l++) lane[l] += x[t + l];
    return tree(lane);
}

#define VEC 16 /* floats in a `vec` */
/* 16 floats as one value: the compiler keeps these in registers (one zmm, two ymm or four xmm
 * by ISA) and applies each operation to every element, exactly as the scalar code would. */
typedef float vec __attribute__((vector_size(4 * VEC)));
#if defined(__GNUC__) && !defined(__clang__)
/* GCC notes that a 64-byte vector value changes the calling convention without AVX-512: these
 * are static functions, inlined, with no calling convention to keep. */
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
static inline vec load(const float* p) {
    vec v;
    memcpy(&v, p, sizeof v);
    return v;
}
#endif

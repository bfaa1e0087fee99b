/* Float arithmetic whose order is fixed in the source (inferd): what decode_attention.c builds
 * its products and sums from, so that a row gets the same bits whatever else a step holds, and
 * every ISA variant the same bits as the others. A reduction left to the compiler (`omp simd
 * reduction`, -ffast-math) may start its vector lanes wherever the data's address is aligned
 * and combine them in any order; these name their lanes. -std=c11 rules out contraction into
 * FMAs (build.py): an FMA is written out (`rfma`), everything else is a plain IEEE operation.
 *
 * A fixed-order sum has LANES = 16 lanes: lane l takes the elements l, l + 16, ..., then `tree`
 * combines the lanes. In registers a lane group is one zmm (AVX-512), two ymm (AVX2) or 16
 * floats (portable, where `rfma` is libm's correctly rounded fmaf: the hardware's bits). */
#ifndef INFERD_FIXED_ORDER_H
#define INFERD_FIXED_ORDER_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16
#define ALWAYS_INLINE static inline __attribute__((always_inline))

#if defined(__AVX512F__)
#include <immintrin.h>
#define REG 16 /* floats per register */
typedef __m512 reg;
ALWAYS_INLINE reg rzero(void) { return _mm512_setzero_ps(); }
ALWAYS_INLINE reg rload(const float* p) { return _mm512_loadu_ps(p); }
ALWAYS_INLINE void rstore(float* p, reg r) { _mm512_storeu_ps(p, r); }
ALWAYS_INLINE reg rsplat(float x) { return _mm512_set1_ps(x); }
ALWAYS_INLINE reg rfma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define REG 8
typedef __m256 reg;
ALWAYS_INLINE reg rzero(void) { return _mm256_setzero_ps(); }
ALWAYS_INLINE reg rload(const float* p) { return _mm256_loadu_ps(p); }
ALWAYS_INLINE void rstore(float* p, reg r) { _mm256_storeu_ps(p, r); }
ALWAYS_INLINE reg rsplat(float x) { return _mm256_set1_ps(x); }
ALWAYS_INLINE reg rfma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
#else
#define REG 1
typedef float reg;
ALWAYS_INLINE reg rzero(void) { return 0.0f; }
ALWAYS_INLINE reg rload(const float* p) { return *p; }
ALWAYS_INLINE void rstore(float* p, reg r) { *p = r; }
ALWAYS_INLINE reg rsplat(float x) { return x; }
ALWAYS_INLINE reg rfma(reg a, reg b, reg c) { return fmaf(a, b, c); }
#endif
#define PER_GROUP (LANES / REG) /* registers per lane group */

/* the first n floats at p (0 < n <= REG), the other lanes 0; nothing past p + n is read */
ALWAYS_INLINE reg rload_n(const float* p, int64_t n) {
    float f[REG] = {0};
    memcpy(f, p, sizeof(float) * (size_t)n);
    return rload(f);
}

ALWAYS_INLINE void rstore_n(float* p, reg r, int64_t n) {
    float f[REG];
    rstore(f, r);
    memcpy(p, f, sizeof(float) * (size_t)n);
}

/* The fixed tree over 16 lanes: lane l += lane l + w for w = 8, 4, 2, 1. */
static inline float tree(float* lane) {
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) lane[l] += lane[l + w];
    return lane[0];
}

/* out[a] = tree(lane group a) for 16 lane groups acc[a][0 .. PER_GROUP), by a butterfly that
 * performs, lane for lane, the additions of `tree` (a + b = b + a in IEEE arithmetic: the pairs
 * are the same). */
static inline void tree16(reg acc[16][PER_GROUP], float out[16]) {
#if defined(__AVX512F__)
    __m512 x[16];
    for (int a = 0; a < 16; a++) x[a] = acc[a][0];
    for (int a = 0; a < 8; a++) /* w = 8: lanes 0-7 of a pair's first, 8-15 of its second */
        x[a] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * a], x[2 * a + 1], 0x44),
                             _mm512_shuffle_f32x4(x[2 * a], x[2 * a + 1], 0xEE));
    for (int a = 0; a < 4; a++) /* w = 4: quad j holds group 4a + j's four */
        x[a] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * a], x[2 * a + 1], 0x88),
                             _mm512_shuffle_f32x4(x[2 * a], x[2 * a + 1], 0xDD));
    for (int a = 0; a < 2; a++) /* w = 2: quad j, groups 8a + j and 8a + 4 + j, two each */
        x[a] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * a], x[2 * a + 1], 0x44),
                             _mm512_shuffle_ps(x[2 * a], x[2 * a + 1], 0xEE));
    /* w = 1: lane 4j + k holds group 4k + j */
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(x[0], x[1], 0x88),
                                   _mm512_shuffle_ps(x[0], x[1], 0xDD));
    const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, r));
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 x[16];
    for (int a = 0; a < 16; a++) x[a] = _mm256_add_ps(acc[a][0], acc[a][1]); /* w = 8 */
    for (int a = 0; a < 8; a++) /* w = 4: group 2a in lanes 0-3, 2a + 1 in 4-7 */
        x[a] = _mm256_add_ps(_mm256_permute2f128_ps(x[2 * a], x[2 * a + 1], 0x20),
                             _mm256_permute2f128_ps(x[2 * a], x[2 * a + 1], 0x31));
    for (int a = 0; a < 4; a++) /* w = 2: groups 4a, 4a + 2 | 4a + 1, 4a + 3, two each */
        x[a] = _mm256_add_ps(_mm256_shuffle_ps(x[2 * a], x[2 * a + 1], 0x44),
                             _mm256_shuffle_ps(x[2 * a], x[2 * a + 1], 0xEE));
    const __m256i order = _mm256_set_epi32(7, 3, 6, 2, 5, 1, 4, 0);
    for (int a = 0; a < 2; a++) { /* w = 1: groups 8a + 0, 2, 4, 6 | 8a + 1, 3, 5, 7 */
        const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(x[2 * a], x[2 * a + 1], 0x88),
                                       _mm256_shuffle_ps(x[2 * a], x[2 * a + 1], 0xDD));
        _mm256_storeu_ps(out + 8 * a, _mm256_permutevar8x32_ps(r, order));
    }
#else
    for (int a = 0; a < 16; a++) out[a] = tree(acc[a]);
#endif
}
#endif

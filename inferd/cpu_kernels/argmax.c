/* Greedy sampling's argmax over the vocabulary, per row (inferd). PyTorch's CPU argmax is a
 * scalar loop on one core: 3.7 ms for 32 rows of Gemma's 262,144 logits, ~4% of a batched
 * decode step. Here each row is two vectorised passes (its maximum, then the first position
 * holding it), the rows in parallel; a step of fewer rows than threads also cuts each row into
 * parts, so that a single decode row's 1 MB of logits is read by every core. Same result as
 * torch.argmax: the lowest index among equal maxima, and NaN counts as the maximum (its first
 * occurrence wins). */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels.h"

#define CHUNK 64
#define PART_MIN 16384 /* columns: below this, a part is not worth a thread */

static int64_t first_nan(const float* v, int64_t n) {
    for (int64_t c = 0; c < n; c++)
        if (v[c] != v[c]) return c;
    return -1;
}

/* The maximum of v [n], and whether it holds a NaN. */
static float max_of(const float* v, int64_t n, int* nan) {
    float best = -INFINITY;
    int any = 0;
#pragma omp simd reduction(max : best) reduction(| : any)
    for (int64_t c = 0; c < n; c++) {
        best = v[c] > best ? v[c] : best;
        any |= v[c] != v[c];
    }
    *nan = any;
    return best;
}

/* The first position of `best` in v [n] (-1 if none) */
static int64_t first_of(const float* v, int64_t n, float best) {
    for (int64_t c0 = 0; c0 < n; c0 += CHUNK) { /* the first chunk holding it */
        const int64_t end = c0 + CHUNK < n ? c0 + CHUNK : n;
        int hit = 0;
#pragma omp simd reduction(| : hit)
        for (int64_t c = c0; c < end; c++) hit |= v[c] == best;
        if (hit) {
            int64_t at = c0;
            while (v[at] != best) at++;
            return at;
        }
    }
    return -1;
}

void inferd_argmax_rows(const float* x, int64_t rows, int64_t cols, int64_t* out) {
    if (rows < 1) return;
    int64_t parts = (omp_get_max_threads() + rows - 1) / rows;
    if (parts > cols / PART_MIN) parts = cols / PART_MIN;
    if (parts < 1) parts = 1;
    float* best = malloc(sizeof(float) * (size_t)(rows * parts));
    int* nan = malloc(sizeof(int) * (size_t)(rows * parts));
    if (!best || !nan) parts = 1; /* then each row is one part, scanned in the loop below */
    if (parts > 1) { /* part p of a row: columns [p cols / parts, (p + 1) cols / parts) */
#pragma omp parallel for schedule(static)
        for (int64_t t = 0; t < rows * parts; t++) {
            const int64_t r = t / parts, p = t % parts;
            const int64_t lo = p * cols / parts, hi = (p + 1) * cols / parts;
            best[t] = max_of(x + r * cols + lo, hi - lo, &nan[t]);
        }
    }
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float* v = x + r * cols;
        if (parts == 1) {
            int any;
            const float top = max_of(v, cols, &any);
            out[r] = any ? first_nan(v, cols) : first_of(v, cols, top);
            continue;
        }
        /* NaN wins in its first part; else the first part holding the row's maximum */
        float top = -INFINITY;
        int64_t where = -1;
        for (int64_t p = 0; p < parts && where < 0; p++) {
            if (nan[r * parts + p]) where = p;
            else if (best[r * parts + p] > top) top = best[r * parts + p];
        }
        if (where < 0)
            for (int64_t p = 0; p < parts && where < 0; p++)
                if (best[r * parts + p] == top) where = p;
        const int64_t lo = where * cols / parts, hi = (where + 1) * cols / parts;
        out[r] = lo + (nan[r * parts + where] ? first_nan(v + lo, hi - lo)
                                              : first_of(v + lo, hi - lo, top));
    }
    free(best);
    free(nan);
}

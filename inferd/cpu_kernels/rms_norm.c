/* RMSNorm of float32 rows in one pass (inferd). PyTorch's CPU rms_norm runs as about eight small
 * ops, ~20 us for a 640-wide row; a decode step of an 18-layer Gemma calls it 91 times. The sum
 * of squares is accumulated in double, so the result is at least as accurate as float32's.
 *
 * NOTE: a row's result must not depend on the other rows of the call (a step's rows are any mix
 * of sequences: docs/performance.md). Each row is one thread's, and its sum has an order fixed in
 * the source (lane l takes elements l, l + 8, ...; then a fixed tree): a reduction left to the
 * compiler may start its vector lanes wherever the row's address is aligned. */
#include <math.h>
#include <stdint.h>

#include "kernels.h"

#define LANES 8
#define PARALLEL_ROWS 16 /* from this many rows, the rows are spread over the threads */

static void norm_row(const float* v, const float* gain, int64_t dim, float eps, float* o) {
    double lane[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= dim; i += LANES)
        for (int l = 0; l < LANES; l++) lane[l] += (double)v[i + l] * v[i + l];
    for (int l = 0; i + l < dim; l++) lane[l] += (double)v[i + l] * v[i + l];
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) lane[l] += lane[l + w];
    const float inv = 1.0f / sqrtf((float)(lane[0] / (double)dim) + eps);
    if (gain)
        for (int64_t c = 0; c < dim; c++) o[c] = v[c] * inv * gain[c];
    else
        for (int64_t c = 0; c < dim; c++) o[c] = v[c] * inv;
}

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * gain  (gain may be NULL: no scaling); out may be x */
void inferd_rms_norm(const float* x, const float* gain, int64_t rows, int64_t dim, float eps,
                     float* out) {
    if (rows < PARALLEL_ROWS) {
        for (int64_t r = 0; r < rows; r++) norm_row(x + r * dim, gain, dim, eps, out + r * dim);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) norm_row(x + r * dim, gain, dim, eps, out + r * dim);
}

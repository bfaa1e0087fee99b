/* LoRA beside a block product (inferd): y[i] += (x[i] A_s) B_s for every row i whose adapter
 * slot s = adapter[i] is not 0 (the base model).
 *
 * Rows are taken adapter by adapter, so each adapter's A and B are read once per step whatever
 * number of its rows; within a group, each row's arithmetic is its own: its rank vector sums
 * x[i, k] A[k, :] over k in order, and its output adds t[c] B[c, :] over the rank columns c in
 * order. NOTE: so a row gets the same bits whichever rows and adapters share its step (the
 * engine's batch invariance, tests/parity/test_lora_engine.py). Both loops are axpys over
 * contiguous rows of A and B, which vectorise without reordering any sum. */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define PARALLEL_ROWS 8

int inferd_lora_add(const LoraLinear* W, const int64_t* adapter, const float* x, int64_t n,
                    float* y) {
    if (W->slots == 0 || adapter == NULL) return 0;
    const int64_t in = W->in, out = W->out, R = W->parts * W->rank;
    int64_t* rows = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    float* t = malloc(sizeof(float) * (size_t)((n > 0 ? n : 1) * R));
    if (!rows || !t) {
        free(rows);
        free(t);
        return -2;
    }
    int rc = 0;
    for (int64_t s = 1; s <= W->slots; s++) {
        int64_t m = 0;
        for (int64_t i = 0; i < n; i++)
            if (adapter[i] == s) rows[m++] = i;
        if (m == 0) continue;
        const float* a = W->a + (s - 1) * in * R;
        const float* b = W->b + (s - 1) * R * out;
#pragma omp parallel for if (m >= PARALLEL_ROWS) schedule(static)
        for (int64_t j = 0; j < m; j++) {
            float* restrict tj = t + j * R;
            const float* restrict xi = x + rows[j] * in;
            float* restrict yi = y + rows[j] * out;
            memset(tj, 0, sizeof(float) * (size_t)R);
            for (int64_t k = 0; k < in; k++) {
                const float xk = xi[k];
                const float* restrict ak = a + k * R;
                for (int64_t c = 0; c < R; c++) tj[c] += xk * ak[c];
            }
            for (int64_t c = 0; c < R; c++) {
                const int64_t p = c / W->rank, c0 = W->cols[p], c1 = W->cols[p + 1];
                const float tc = tj[c];
                const float* restrict bc = b + c * out;
                for (int64_t o = c0; o < c1; o++) yi[o] += tc * bc[o];
            }
        }
    }
    free(rows);
    free(t);
    return rc;
}

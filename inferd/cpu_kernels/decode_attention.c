/* Decode attention over the paged KV cache, float32 or bfloat16 cache (inferd). One new token per sequence:
 * the query heads that share a KV head read its keys and values together, straight from the
 * pool (no gather into a padded copy). PyTorch needs about ten ops per layer for the same (block
 * gather, two batched matmuls, mask, softmax): ~150 us for one sequence of 200 tokens.
 *
 * Work is split over (sequence, KV head) and over as many ranges of keys as there are threads
 * (one sequence, one KV head: Gemma 3 270M still feeds every thread); each range keeps its own
 * running max and sum (the online softmax), merged at the end. Products in float32 (a bf16
 * cache row is widened once per key, for all the query heads that read it). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "vec_exp.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#define LANES 16
#define MAX_GROUP 16 /* query heads per KV head handled together */

typedef struct {
    const float* q;                 /* [n, H, D] */
    const void* k_pool, *v_pool;    /* [num_blocks, bs, KV, D], float32 or bfloat16 */
    const int64_t* blocks;          /* [n, width] */
    const int64_t* starts, *lens;   /* [n] */
    int64_t width, bs, H, KV, D, window, bf16;
    float scale, softcap;
} Problem;

/* The cache row of position p of sequence i, KV head kvh, as float32 (widened into `buf` when
 * the cache is bfloat16). */
static inline const float* slot(const Problem* P, const void* pool, int64_t i, int64_t p,
                                int64_t kvh, float* buf) {
    const int64_t off = p - P->starts[i];
    const int64_t block = P->blocks[i * P->width + off / P->bs];
    const int64_t at = ((block * P->bs + off % P->bs) * P->KV + kvh) * P->D;
    if (!P->bf16) return (const float*)pool + at;
    const uint16_t* h = (const uint16_t*)pool + at;
    for (int64_t d = 0; d < P->D; d++) {
        const uint32_t bits = (uint32_t)h[d] << 16;
        memcpy(buf + d, &bits, 4);
    }
    return buf;
}

/* Keys [p0, p1) of sequence i for the `group` heads of KV head kvh: writes each head's max,
 * sum of exp and unnormalised output (acc [group, D]). */
static void attend_range(const Problem* P, int64_t i, int64_t kvh, int64_t group, int64_t p0,
                         int64_t p1, float* scores /* [group, p1 - p0] */, float* mx,
                         float* sum, float* acc, float* row /* [D] */) {
    const int64_t D = P->D, len = p1 - p0;
    const float* q = P->q + (i * P->H + kvh * group) * D;
    for (int64_t p = p0; p < p1; p++) {
        const float* k = slot(P, P->k_pool, i, p, kvh, row);
        for (int64_t g = 0; g < group; g++) {
            float lane[LANES] = {0};
            const float* qg = q + g * D;
            int64_t d = 0;
            for (; d + LANES <= D; d += LANES)
                for (int l = 0; l < LANES; l++) lane[l] += qg[d + l] * k[d + l];
            float s = 0.0f;
            for (; d < D; d++) s += qg[d] * k[d];
            for (int l = 0; l < LANES; l++) s += lane[l];
            s *= P->scale;
            if (P->softcap > 0.0f) s = P->softcap * tanhf(s / P->softcap);
            scores[g * len + (p - p0)] = s;
        }
    }
    for (int64_t g = 0; g < group; g++) {
        float* sg = scores + g * len;
        float best = -INFINITY, total = 0.0f;
        for (int64_t t = 0; t < len; t++) best = sg[t] > best ? sg[t] : best;
        for (int64_t t = 0; t < len; t++) sg[t] = inferd_exp(sg[t] - best); /* vectorises */
        for (int64_t t = 0; t < len; t++) total += sg[t];
        mx[g] = best;
        sum[g] = total;
    }
    memset(acc, 0, sizeof(float) * (size_t)(group * D));
    for (int64_t p = p0; p < p1; p++) {
        const float* v = slot(P, P->v_pool, i, p, kvh, row);
        for (int64_t g = 0; g < group; g++) {
            const float w = scores[g * len + (p - p0)];
            float* a = acc + g * D;
            for (int64_t d = 0; d < D; d++) a[d] += w * v[d];
        }
    }
}

/* q [n, H, D]; k_pool, v_pool [num_blocks, bs, KV, D] (bfloat16 with cache_bf16, else float32);
 * blocks [n, width]: the cache blocks of each sequence from position starts[i] on (padding
 * blocks past its end are never read);
 * lens [n]: context lengths; window: 0, or keys older than lens - window are not seen;
 * softcap: 0, or scores become softcap * tanh(score / softcap). out [n, H, D]. Returns 0, or
 * -1 if more than MAX_GROUP query heads share a KV head, -2 if out of memory. */
int inferd_decode_attention(const float* q, const void* k_pool, const void* v_pool,
                            const int64_t* blocks, const int64_t* starts, const int64_t* lens,
                            int64_t n, int64_t width, int64_t bs, int64_t H, int64_t KV,
                            int64_t D, float scale, int64_t window, float softcap,
                            int64_t cache_bf16, float* out) {
    const Problem P = {q, k_pool, v_pool, blocks, starts, lens, width, bs, H, KV, D, window,
                       cache_bf16, scale, softcap};
    const int64_t group = H / KV;
    if (group > MAX_GROUP) return -1;
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    /* Keys in `threads` ranges for every (sequence, KV head) pair, however many pairs there
     * are: the ranges feed the threads for one sequence, and a sequence's result does not depend
     * on the rest of the batch (the same bits alone, in a batch, or as one of the rows of a
     * speculative verification step; int8 activations downstream would amplify any change). */
    const int64_t pairs = n * KV;
    const int64_t splits = threads;
    const int64_t tasks = pairs * splits;
    const int64_t max_keys = width * bs;
    /* per task: max and sum per head, then the unnormalised outputs */
    float* part = malloc(sizeof(float) * (size_t)(tasks * group * (D + 2)));
    if (!part) return -2;
    int failed = 0;
#pragma omp parallel
    {
        float* scores = malloc(sizeof(float) * (size_t)(group * max_keys + D));
        if (!scores) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t task = 0; task < tasks; task++) {
            if (!scores) continue;
            const int64_t pair = task / splits, part_i = task % splits;
            const int64_t i = pair / KV, kvh = pair % KV, len = lens[i];
            const int64_t lo = window > 0 && len > window ? len - window : 0;
            const int64_t chunk = (len - lo + splits - 1) / splits;
            const int64_t p0 = lo + part_i * chunk;
            const int64_t p1 = p0 + chunk < len ? p0 + chunk : len;
            float* mx = part + task * group * (D + 2);
            float* sum = mx + group;
            float* acc = sum + group;
            if (p0 >= p1) {
                for (int64_t g = 0; g < group; g++) mx[g] = -INFINITY, sum[g] = 0.0f;
                memset(acc, 0, sizeof(float) * (size_t)(group * D));
            } else {
                attend_range(&P, i, kvh, group, p0, p1, scores, mx, sum, acc,
                             scores + group * max_keys);
            }
        }
        free(scores);
    }
    if (!failed) {
        /* merge the ranges of each (sequence, KV head): rescale to the overall max */
        for (int64_t pair = 0; pair < pairs; pair++) {
            const int64_t i = pair / KV, kvh = pair % KV;
            for (int64_t g = 0; g < group; g++) {
                float best = -INFINITY, total = 0.0f;
                for (int64_t s = 0; s < splits; s++) {
                    const float m = part[(pair * splits + s) * group * (D + 2) + g];
                    best = m > best ? m : best;
                }
                float* o = out + (i * H + kvh * group + g) * D;
                memset(o, 0, sizeof(float) * (size_t)D);
                for (int64_t s = 0; s < splits; s++) {
                    const float* base = part + (pair * splits + s) * group * (D + 2);
                    if (base[g + group] == 0.0f) continue; /* an empty range */
                    const float w = expf(base[g] - best);
                    total += w * base[g + group];
                    const float* a = base + 2 * group + g * D;
                    for (int64_t d = 0; d < D; d++) o[d] += w * a[d];
                }
                for (int64_t d = 0; d < D; d++) o[d] /= total;
            }
        }
    }
    free(part);
    return failed ? -2 : 0;
}

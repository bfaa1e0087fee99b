/* Attention over the paged KV cache for every query row of a step, with a fixed reduction order
 * per row (inferd). Decode rows, the rows of a prefill chunk and speculative verification rows
 * all take this one function, and a row's result depends only on its query, its keys and
 * values, and this build: not on the other rows of the step, nor on how its prompt was chunked,
 * nor on the number of threads.
 *
 * The order: a row's visible keys (its own position and those before it, inside the sliding
 * window if any) are cut into chunks of KEY_CHUNK positions aligned to absolute positions
 * (0..63, 64..127, ...). Per chunk and query head, in a fixed order: the scores (each a dot
 * product over 16 lanes, combined by a fixed tree), their maximum, the sum of exp(score - max)
 * (16 lanes, the same tree) and the unnormalised output (keys in ascending order). The chunks
 * are then folded in ascending order into a running (max, sum, output), and the output divided
 * by the sum. Which thread computes a chunk, and whether the fold happens right after each chunk
 * or once all of a wave's chunks are stored, changes no operation.
 *
 * Work: the rows of one sequence in a step form tiles of up to ROW_TILE consecutive rows; a unit
 * of work is a tile and one KV head (its query heads together), so a prefill chunk's rows read
 * each key and value once per tile instead of once per row. Many units (prefill, big batches):
 * the threads take whole units. Few (decode of a few sequences): the threads take the chunks of
 * the units, a wave at a time, store each chunk's partial results and fold them afterwards.
 * Products in float32; a bf16 cache row is widened once per key for the whole tile. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fixed_order.h"
#include "kernels.h"
#include "vec_exp.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#define KEY_CHUNK 64 /* positions per chunk, aligned to absolute positions */
#define ROW_TILE 8   /* query rows of one sequence per unit of work */

typedef struct {
    const float* q; /* [rows, H, D] */
    const void *k_pool, *v_pool;
    const KeyPlan* plan;
    int64_t H, KV, D, G, window, bf16;
    float scale, softcap;
} Problem;

typedef struct {
    int64_t seq, r0, r1; /* rows r0 .. r1-1 of sequence seq */
    int64_t c0, c1;      /* the chunks any of them sees: c0 .. c1 */
} Tile;

/* The first key row i sees (the last is lens[i] - 1). */
static inline int64_t first_key(const Problem* P, int64_t i) {
    const int64_t len = P->plan->lens[i];
    return P->window > 0 && len > P->window ? len - P->window : 0;
}

/* Where the cache row of position p of sequence s, KV head kvh, starts (in elements). */
static inline int64_t row_at(const Problem* P, int64_t s, int64_t p, int64_t kvh) {
    const KeyPlan* K = P->plan;
    const int64_t off = p - K->starts[s];
    const int64_t block = K->blocks[s * K->width + off / K->block_size];
    return ((block * K->block_size + off % K->block_size) * P->KV + kvh) * P->D;
}

/* `len` elements of a cache row from element `at`, as float32 (widened into `buf` from a
 * bfloat16 cache). */
static inline const float* cache_row(const Problem* P, const void* pool, int64_t at, float* buf,
                                     int64_t len) {
    if (!P->bf16) return (const float*)pool + at;
    const uint16_t* h = (const uint16_t*)pool + at;
    for (int64_t d = 0; d < len; d++) {
        const uint32_t bits = (uint32_t)h[d] << 16;
        memcpy(buf + d, &bits, 4);
    }
    return buf;
}

/* A partial result of one query head over one chunk, or the running fold of several:
 * [max, sum of exp, output[D]]. */
#define PART(D) ((D) + 2)

/* out[g] (the output slots of PART(D) partials, g < G) = the sum over keys t = lo .. hi-1, in
 * that order, of w[g][t] * value(t), w[g] at stride KEY_CHUNK from `first`. The values' columns
 * go VALUE_BLOCK at a time, so that four heads' sums stay in registers across the keys (as
 * `vec` values); each sum is the same chain of operations as a plain loop over t. */
#define VALUE_BLOCK 32
static void weigh_values(const Problem* P, const int64_t* at, int64_t lo, int64_t hi,
                         const float* w, int64_t first, float* out, float* buf) {
    const int64_t D = P->D, G = P->G;
    for (int64_t g0 = 0; g0 < G; g0 += 4) {
        const int64_t heads = G - g0 < 4 ? G - g0 : 4;
        const float* x = w + g0 * KEY_CHUNK + first - lo;
        for (int64_t d0 = 0; d0 < D; d0 += VALUE_BLOCK) {
            const int64_t len = D - d0 < VALUE_BLOCK ? D - d0 : VALUE_BLOCK;
            float* o = out + g0 * PART(D) + 2 + d0;
            if (heads == 4 && len == VALUE_BLOCK) {
                vec a[4][VALUE_BLOCK / VEC] = {{{0}}};
                for (int64_t t = lo; t < hi; t++) {
                    const float* v = cache_row(P, P->v_pool, at[t - lo] + d0, buf, len);
                    for (int g = 0; g < 4; g++) {
                        const float xg = x[g * KEY_CHUNK + t];
                        for (int b = 0; b < VALUE_BLOCK / VEC; b++)
                            a[g][b] += xg * load(v + b * VEC);
                    }
                }
                for (int g = 0; g < 4; g++) memcpy(o + g * PART(D), a[g], sizeof a[g]);
                continue;
            }
            for (int64_t g = 0; g < heads; g++) {
                float a[VALUE_BLOCK] = {0};
                for (int64_t t = lo; t < hi; t++) {
                    const float* v = cache_row(P, P->v_pool, at[t - lo] + d0, buf, len);
                    for (int64_t d = 0; d < len; d++) a[d] += x[g * KEY_CHUNK + t] * v[d];
                }
                memcpy(o + g * PART(D), a, sizeof(float) * (size_t)len);
            }
        }
    }
}

/* Partial results of chunk c for every row of tile T with visible keys in it, KV head kvh:
 * part [rows of T, G, PART(D)] (rows without such keys are left as they are). `scores`:
 * [ROW_TILE * G * KEY_CHUNK] scratch, `buf` [D]. */
static void chunk_partials(const Problem* P, const Tile* T, int64_t kvh, int64_t c, float* part,
                           float* scores, float* buf) {
    const int64_t D = P->D, G = P->G, k0 = c * KEY_CHUNK, k1 = k0 + KEY_CHUNK;
    int64_t lo[ROW_TILE], hi[ROW_TILE], ua = k1, ub = k0;
    for (int64_t r = T->r0; r < T->r1; r++) {
        const int64_t a = first_key(P, r), b = P->plan->lens[r], j = r - T->r0;
        lo[j] = a > k0 ? a : k0;
        hi[j] = b < k1 ? b : k1;
        if (lo[j] < hi[j]) {
            ua = lo[j] < ua ? lo[j] : ua;
            ub = hi[j] > ub ? hi[j] : ub;
        }
    }
    const int64_t rows = T->r1 - T->r0;
    int64_t at[KEY_CHUNK];
    for (int64_t t = ua; t < ub; t++) at[t - ua] = row_at(P, T->seq, t, kvh);
    for (int64_t t = ua; t < ub; t++) { /* each key once for the tile */
        const float* k = cache_row(P, P->k_pool, at[t - ua], buf, D);
        for (int64_t j = 0; j < rows; j++) {
            if (t < lo[j] || t >= hi[j]) continue;
            const float* q = P->q + ((T->r0 + j) * P->H + kvh * G) * D;
            float s[4];
            for (int64_t g0 = 0; g0 < G; g0 += 4) {
                const int64_t heads = G - g0 < 4 ? G - g0 : 4;
                if (heads == 4)
                    dot4(q + g0 * D, k, D, s);
                else
                    for (int64_t g = 0; g < heads; g++) s[g] = dot(q + (g0 + g) * D, k, D);
                for (int64_t g = 0; g < heads; g++) {
                    float x = s[g] * P->scale;
                    if (P->softcap > 0.0f) x = P->softcap * tanhf(x / P->softcap);
                    scores[(j * G + g0 + g) * KEY_CHUNK + (t - k0)] = x;
                }
            }
        }
    }
    for (int64_t j = 0; j < rows; j++) {
        if (lo[j] >= hi[j]) continue;
        for (int64_t g = 0; g < G; g++) {
            float* s = scores + (j * G + g) * KEY_CHUNK + (lo[j] - k0);
            const int64_t n = hi[j] - lo[j];
            float best = -INFINITY;
            for (int64_t t = 0; t < n; t++) best = s[t] > best ? s[t] : best;
            for (int64_t t = 0; t < n; t++) s[t] = inferd_exp(s[t] - best); /* vectorises */
            float* p = part + (j * G + g) * PART(D);
            p[0] = best;
            p[1] = sum(s, n);
        }
    }
    for (int64_t j = 0; j < rows; j++)
        if (lo[j] < hi[j]) weigh_values(P, at + (lo[j] - ua), lo[j], hi[j],
                                        scores + j * G * KEY_CHUNK, lo[j] - k0,
                                        part + j * G * PART(D), buf);
}

/* Whether row r of tile T sees any key of chunk c. */
static inline int sees(const Problem* P, int64_t r, int64_t c) {
    return first_key(P, r) < (c + 1) * KEY_CHUNK && P->plan->lens[r] > c * KEY_CHUNK;
}

/* Fold chunk c's partials of tile T into its running state (both [rows, G, PART(D)]); a row's
 * first visible chunk starts its state. */
static void fold(const Problem* P, const Tile* T, int64_t c, const float* part, float* state) {
    const int64_t D = P->D, G = P->G;
    for (int64_t r = T->r0; r < T->r1; r++) {
        if (!sees(P, r, c)) continue;
        const int first = first_key(P, r) / KEY_CHUNK == c;
        for (int64_t g = 0; g < G; g++) {
            const int64_t at = ((r - T->r0) * G + g) * PART(D);
            const float* p = part + at;
            float* s = state + at;
            if (first) {
                memcpy(s, p, sizeof(float) * (size_t)PART(D));
                continue;
            }
            const float m = p[0] > s[0] ? p[0] : s[0];
            const float a = inferd_exp(s[0] - m), b = inferd_exp(p[0] - m);
            s[0] = m;
            s[1] = s[1] * a + p[1] * b;
            for (int64_t d = 0; d < D; d++) s[2 + d] = s[2 + d] * a + p[2 + d] * b;
        }
    }
}

static void finish(const Problem* P, const Tile* T, int64_t kvh, const float* state, float* out) {
    const int64_t D = P->D, G = P->G;
    for (int64_t r = T->r0; r < T->r1; r++)
        for (int64_t g = 0; g < G; g++) {
            const float* s = state + ((r - T->r0) * G + g) * PART(D);
            float* o = out + (r * P->H + kvh * G + g) * D;
            for (int64_t d = 0; d < D; d++) o[d] = s[2 + d] / s[1];
        }
}

/* The tiles of the plan's sequences: consecutive rows of one sequence, ROW_TILE at most. */
static Tile* make_tiles(const Problem* P, int64_t* count) {
    const KeyPlan* K = P->plan;
    int64_t n = 0;
    for (int64_t s = 0; s < K->seqs; s++)
        n += (K->seq_rows[s + 1] - K->seq_rows[s] + ROW_TILE - 1) / ROW_TILE;
    Tile* tiles = malloc(sizeof(Tile) * (size_t)(n ? n : 1));
    if (!tiles) return NULL;
    int64_t i = 0;
    for (int64_t s = 0; s < K->seqs; s++)
        for (int64_t r0 = K->seq_rows[s]; r0 < K->seq_rows[s + 1]; r0 += ROW_TILE) {
            Tile* T = &tiles[i++];
            T->seq = s, T->r0 = r0;
            T->r1 = r0 + ROW_TILE < K->seq_rows[s + 1] ? r0 + ROW_TILE : K->seq_rows[s + 1];
            int64_t a = INT64_MAX, b = 0;
            for (int64_t r = T->r0; r < T->r1; r++) {
                const int64_t f = first_key(P, r), l = K->lens[r];
                a = f < a ? f : a;
                b = l > b ? l : b;
            }
            T->c0 = a / KEY_CHUNK, T->c1 = (b - 1) / KEY_CHUNK;
        }
    *count = n;
    return tiles;
}

/* Many units: each thread takes whole units and folds chunk by chunk. */
static int by_units(const Problem* P, const Tile* tiles, int64_t units, float* out) {
    const int64_t slab = ROW_TILE * P->G * PART(P->D);
    int failed = 0;
#pragma omp parallel
    {
        float* mem = malloc(sizeof(float) * (size_t)(2 * slab + ROW_TILE * P->G * KEY_CHUNK + P->D));
        if (!mem) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < units; u++) {
            if (!mem) continue;
            const Tile* T = &tiles[u / P->KV];
            const int64_t kvh = u % P->KV;
            float *part = mem, *state = mem + slab, *scores = mem + 2 * slab;
            for (int64_t c = T->c0; c <= T->c1; c++) {
                chunk_partials(P, T, kvh, c, part, scores, scores + ROW_TILE * P->G * KEY_CHUNK);
                fold(P, T, c, part, state);
            }
            finish(P, T, kvh, state, out);
        }
        free(mem);
    }
    return failed ? -2 : 0;
}

/* Few units: the threads share each unit's chunks, `wave` chunks per unit at a time, whose
 * partials are stored and then folded in order. */
static int by_chunks(const Problem* P, const Tile* tiles, int64_t units, int64_t wave,
                     float* out) {
    const int64_t slab = ROW_TILE * P->G * PART(P->D);
    float* parts = malloc(sizeof(float) * (size_t)(units * (wave + 1) * slab));
    if (!parts) return -2;
    float* states = parts + units * wave * slab;
    int64_t longest = 0;
    for (int64_t u = 0; u < units; u++) {
        const Tile* T = &tiles[u / P->KV];
        longest = T->c1 - T->c0 + 1 > longest ? T->c1 - T->c0 + 1 : longest;
    }
    int failed = 0;
    for (int64_t w0 = 0; w0 < longest && !failed; w0 += wave) {
#pragma omp parallel
        {
            float* scores = malloc(sizeof(float) * (size_t)(ROW_TILE * P->G * KEY_CHUNK + P->D));
            if (!scores) {
#pragma omp atomic write
                failed = 1;
            }
#pragma omp for schedule(dynamic, 1)
            for (int64_t task = 0; task < units * wave; task++) {
                const int64_t u = task / wave, c = tiles[u / P->KV].c0 + w0 + task % wave;
                if (scores && c <= tiles[u / P->KV].c1)
                    chunk_partials(P, &tiles[u / P->KV], u % P->KV, c, parts + task * slab,
                                   scores, scores + ROW_TILE * P->G * KEY_CHUNK);
            }
            free(scores);
        }
        for (int64_t u = 0; u < units && !failed; u++) { /* in chunk order: a few folds */
            const Tile* T = &tiles[u / P->KV];
            for (int64_t j = 0; j < wave && T->c0 + w0 + j <= T->c1; j++)
                fold(P, T, T->c0 + w0 + j, parts + (u * wave + j) * slab, states + u * slab);
        }
    }
    if (!failed)
        for (int64_t u = 0; u < units; u++)
            finish(P, &tiles[u / P->KV], u % P->KV, states + u * slab, out);
    free(parts);
    return failed ? -2 : 0;
}

/* q [rows, H, D] (float32), the plan's keys in k_pool / v_pool ([num_blocks, block_size, KV, D],
 * float32 or bfloat16) -> out [rows, H, D]. Returns 0, -1 for a shape it does not take (H not a
 * multiple of KV), -2 if out of memory. */
int inferd_paged_attention(const float* q, const void* k_pool, const void* v_pool,
                           const KeyPlan* plan, const AttentionShape* shape, float* out) {
    const int64_t H = shape->heads, KV = shape->kv_heads;
    if (KV < 1 || H % KV) return -1;
    const Problem P = {q, k_pool, v_pool, plan, H, KV, shape->head_dim, H / KV, shape->window,
                       shape->cache_bf16, shape->scale, shape->softcap};
    int64_t count = 0;
    Tile* tiles = make_tiles(&P, &count);
    if (!tiles) return -2;
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    const int64_t units = count * KV, target = 4 * (int64_t)threads;
    int rc = 0;
    if (units >= target)
        rc = by_units(&P, tiles, units, out);
    else if (units > 0)
        rc = by_chunks(&P, tiles, units, (target + units - 1) / units, out);
    free(tiles);
    return rc;
}

/* Attention over the paged KV cache for every query row of a step, with a fixed reduction order
 * per row (inferd). Decode rows, the rows of a prefill chunk and speculative verification rows
 * all take this one function, and a row's result depends only on its query, its keys and
 * values, and this build: not on the other rows of the step, nor on how its prompt was chunked,
 * nor on the number of threads.
 *
 * The order: a row's visible keys (its own position and those before it, inside the sliding
 * window if any) are cut into chunks of KEY_CHUNK positions aligned to absolute positions
 * (0..63, 64..127, ...). Per chunk and query head, in a fixed order: the scores (each a chain
 * of FMAs over 16 lanes of the head dimension, combined by a fixed tree: attention_tiles.h),
 * their maximum, the weights e^(score - max) and their sum (16 lanes by key position, the same
 * tree), and the unnormalised output (per value of d a chain of FMAs over the keys in
 * ascending order). The chunks are then folded in ascending order into a running (max, sum,
 * output), and the output divided by the sum. Which thread computes a chunk, and whether the
 * fold happens right after each chunk or once all of a wave's chunks are stored, changes no
 * operation; nor does the ISA variant (every one performs the same IEEE operations).
 *
 * Work: the rows of one sequence in a step form tiles of up to ROW_TILE consecutive rows; a unit
 * of work is a tile and one KV head (its query heads together). Within a chunk the products are
 * shaped like a GEMM (attention_tiles.h): 4 query vectors (a row's heads, or several rows') x 4
 * keys per block of scores, a query head's weights x 64 values of d per block of the output,
 * each key and value row loaded once per block. Many units (prefill, big batches): the threads
 * take whole units. Few (decode of a few sequences): the threads take the chunks of the units,
 * a wave at a time, store each chunk's partial results and fold them afterwards. Products in
 * float32; a bf16 cache's chunk is widened once per tile, an int8 cache's dequantised (code x
 * its row's scale, kv_int8.h): one IEEE product per value, the same in every variant. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_tiles.h"
#include "kernels.h"
#include "kv_int8.h"
#include "vec_exp.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#define KEY_CHUNK 64 /* positions per chunk, aligned to absolute positions */
#define ROW_TILE 16  /* query rows of one sequence per unit of work */

typedef struct {
    const float* q; /* [rows, H, D] */
    const void *k_pool, *v_pool;
    const KeyPlan* plan;
    int64_t H, KV, D, G, window, format; /* format: CACHE_F32, CACHE_BF16 or CACHE_INT8 */
    int64_t row;                         /* elements of a cache row: kv_row_width */
    float scale, softcap;
    const float* sinks; /* [H] or NULL */
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
    return ((block * K->block_size + off % K->block_size) * P->KV + kvh) * P->row;
}

/* The D values of the cache row at element `at`, as float32: in place (a float32 cache), or
 * into `buf` (bfloat16 widened, int8 dequantised). */
static inline const float* cache_row(const Problem* P, const void* pool, int64_t at, float* buf) {
    if (P->format == CACHE_F32) return (const float*)pool + at;
    if (P->format == CACHE_INT8) {
        kv_int8_dequantize((const int8_t*)pool + at, P->D, buf);
        return buf;
    }
    const uint16_t* h = (const uint16_t*)pool + at;
    for (int64_t d = 0; d < P->D; d++) {
        const uint32_t bits = (uint32_t)h[d] << 16;
        memcpy(buf + d, &bits, 4);
    }
    return buf;
}

/* A partial result of one query head over one chunk, or the running fold of several:
 * [max, sum of exp, output[D]]. */
#define PART(D) ((D) + 2)

/* A thread's scratch: scores [rows * G, KEY_CHUNK] (then the softmax weights), and the chunk's
 * keys and values as float32 [KEY_CHUNK, D] (a bfloat16 or int8 cache). */
typedef struct {
    float *scores, *keys, *values;
} Scratch;

static size_t scratch_floats(const Problem* P, int64_t rows) {
    return (size_t)(rows * P->G * KEY_CHUNK + 2 * KEY_CHUNK * P->D);
}

static Scratch scratch_at(const Problem* P, int64_t rows, float* mem) {
    const int64_t s = rows * P->G * KEY_CHUNK;
    return (Scratch){mem, mem + s, mem + s + KEY_CHUNK * P->D};
}

/* Scores of query vector row s (KEY_CHUNK entries, key t of the chunk at t) -> the softmax's
 * weights e^(x - max) on the keys lo .. hi-1 (chunk-relative), 0 elsewhere; returns
 * (max, sum). The sum's lanes are key t mod 16, each in ascending t, then `tree`: a key the
 * vector does not see adds 0 to a lane >= 0, which changes nothing. Plain loops over the whole
 * chunk, which the compiler vectorises (selects, no reductions). */
static void softmax_chunk(const Problem* P, float* restrict s, int64_t lo, int64_t hi,
                          float* max_sum) {
    for (int64_t t = 0; t < KEY_CHUNK; t++) s[t] *= P->scale;
    if (P->softcap > 0.0f)
        for (int64_t t = lo; t < hi; t++) s[t] = P->softcap * tanhf(s[t] / P->softcap);
    float best = -INFINITY;
    for (int64_t t = lo; t < hi; t++) best = s[t] > best ? s[t] : best;
    for (int64_t t = 0; t < KEY_CHUNK; t++) { /* no arithmetic on lanes it does not see */
        const int keep = t >= lo && t < hi;
        const float e = inferd_exp((keep ? s[t] : best) - best);
        s[t] = keep ? e : 0.0f;
    }
    float lane[LANES] = {0};
    for (int64_t t = 0; t < KEY_CHUNK; t += LANES)
        for (int l = 0; l < LANES; l++) lane[l] += s[t + l];
    max_sum[0] = best;
    max_sum[1] = tree(lane);
}

/* Partial results of chunk c for every row of tile T with visible keys in it, KV head kvh:
 * part [rows of T, G, PART(D)] (rows without such keys are left as they are). Query vector
 * i = j G + g is head kvh G + g of the tile's row j. */
static void chunk_partials(const Problem* P, const Tile* T, int64_t kvh, int64_t c, float* part,
                           Scratch S) {
    const int64_t D = P->D, G = P->G, k0 = c * KEY_CHUNK, k1 = k0 + KEY_CHUNK;
    int64_t lo[ROW_TILE], hi[ROW_TILE], ua = KEY_CHUNK, ub = 0;
    const int64_t rows = T->r1 - T->r0, nq = rows * G;
    for (int64_t j = 0; j < rows; j++) {
        const int64_t a = first_key(P, T->r0 + j), b = P->plan->lens[T->r0 + j];
        lo[j] = (a > k0 ? a : k0) - k0; /* chunk-relative from here on */
        hi[j] = (b < k1 ? b : k1) - k0;
        if (lo[j] < hi[j]) {
            ua = lo[j] < ua ? lo[j] : ua;
            ub = hi[j] > ub ? hi[j] : ub;
        }
    }
    if (ua >= ub) return;
    const float *key[KEY_CHUNK], *val[KEY_CHUNK];
    for (int64_t t = ua; t < ub; t++) {
        const int64_t at = row_at(P, T->seq, k0 + t, kvh);
        key[t] = cache_row(P, P->k_pool, at, S.keys + t * D);
        val[t] = cache_row(P, P->v_pool, at, S.values + t * D);
    }
    for (int64_t i0 = 0; i0 < nq; i0 += 4) { /* scores, 4 query vectors x 4 keys a block */
        const int64_t n = nq - i0 < 4 ? nq - i0 : 4, ja = i0 / G, jb = (i0 + n - 1) / G;
        int64_t a = KEY_CHUNK, b = 0;
        for (int64_t j = ja; j <= jb; j++)
            if (lo[j] < hi[j]) a = lo[j] < a ? lo[j] : a, b = hi[j] > b ? hi[j] : b;
        const float* q[4];
        for (int64_t i = 0; i < 4; i++) { /* a block short of vectors repeats its last */
            const int64_t at = i0 + (i < n ? i : n - 1);
            q[i] = P->q + ((T->r0 + at / G) * P->H + kvh * G + at % G) * D;
        }
        for (int64_t t = a; t < b; t += 4) {
            const float* k[4];
            float out[16];
            for (int64_t j = 0; j < 4; j++) k[j] = key[t + j < b ? t + j : b - 1];
            qk_block(q, k, D, out);
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < 4 && t + j < b; j++)
                    S.scores[(i0 + i) * KEY_CHUNK + t + j] = out[4 * i + j];
        }
    }
    for (int64_t j = 0; j < rows; j++) {
        if (lo[j] >= hi[j]) continue;
        for (int64_t g = 0; g < G; g++) {
            float* p = part + (j * G + g) * PART(D);
            softmax_chunk(P, S.scores + (j * G + g) * KEY_CHUNK, lo[j], hi[j], p);
            memset(p + 2, 0, sizeof(float) * (size_t)D);
        }
    }
    weigh_values(rows, G, lo, hi, S.scores, KEY_CHUNK, val, D, part + 2, PART(D));
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

/* out = output / sum. A sink joins the sum as one more term of the running (max, sum): with
 * m = max(max, sink), out = output e^(max - m) / (sum e^(max - m) + e^(sink - m)), after the
 * keys' fold (its place in a fixed order; it weighs no value). */
static void finish(const Problem* P, const Tile* T, int64_t kvh, const float* state, float* out) {
    const int64_t D = P->D, G = P->G;
    for (int64_t r = T->r0; r < T->r1; r++)
        for (int64_t g = 0; g < G; g++) {
            const float* s = state + ((r - T->r0) * G + g) * PART(D);
            float* o = out + (r * P->H + kvh * G + g) * D;
            if (!P->sinks) {
                for (int64_t d = 0; d < D; d++) o[d] = s[2 + d] / s[1];
                continue;
            }
            const float sink = P->sinks[kvh * G + g];
            const float m = sink > s[0] ? sink : s[0];
            const float a = inferd_exp(s[0] - m);
            const float sum = s[1] * a + inferd_exp(sink - m);
            for (int64_t d = 0; d < D; d++) o[d] = s[2 + d] * a / sum;
        }
}

/* The tiles of the plan's sequences: consecutive rows of one sequence, ROW_TILE at most;
 * `tallest`: the most rows a tile has. */
static Tile* make_tiles(const Problem* P, int64_t* count, int64_t* tallest) {
    const KeyPlan* K = P->plan;
    int64_t n = 0;
    for (int64_t s = 0; s < K->seqs; s++)
        n += (K->seq_rows[s + 1] - K->seq_rows[s] + ROW_TILE - 1) / ROW_TILE;
    Tile* tiles = malloc(sizeof(Tile) * (size_t)(n ? n : 1));
    if (!tiles) return NULL;
    int64_t i = 0;
    *tallest = 1;
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
            *tallest = T->r1 - T->r0 > *tallest ? T->r1 - T->r0 : *tallest;
        }
    *count = n;
    return tiles;
}

/* Many units: each thread takes whole units and folds chunk by chunk; the last units first,
 * since a prompt's later rows see more keys: the longest units then start early, and the
 * threads end together. */
static int by_units(const Problem* P, const Tile* tiles, int64_t units, int64_t tall,
                    float* out) {
    const int64_t slab = tall * P->G * PART(P->D);
    int failed = 0;
#pragma omp parallel
    {
        float* mem = malloc(sizeof(float) * (2 * (size_t)slab + scratch_floats(P, tall)));
        if (!mem) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t taken = 0; taken < units; taken++) {
            const int64_t u = units - 1 - taken;
            if (!mem) continue;
            const Tile* T = &tiles[u / P->KV];
            const int64_t kvh = u % P->KV;
            float *part = mem, *state = mem + slab;
            const Scratch scratch = scratch_at(P, tall, mem + 2 * slab);
            for (int64_t c = T->c0; c <= T->c1; c++) {
                chunk_partials(P, T, kvh, c, part, scratch);
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
static int by_chunks(const Problem* P, const Tile* tiles, int64_t units, int64_t tall,
                     int64_t wave, float* out) {
    const int64_t slab = tall * P->G * PART(P->D);
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
            float* scores = malloc(sizeof(float) * scratch_floats(P, tall));
            if (!scores) {
#pragma omp atomic write
                failed = 1;
            }
#pragma omp for schedule(dynamic, 1)
            for (int64_t task = 0; task < units * wave; task++) {
                const int64_t u = task / wave, c = tiles[u / P->KV].c0 + w0 + task % wave;
                if (scores && c <= tiles[u / P->KV].c1)
                    chunk_partials(P, &tiles[u / P->KV], u % P->KV, c, parts + task * slab,
                                   scratch_at(P, tall, scores));
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

/* q [rows, H, D] (float32), the plan's keys in k_pool / v_pool ([num_blocks, block_size, KV, D]
 * float32 or bfloat16, or [.., D + 4] int8 rows) -> out [rows, H, D]. Returns 0, -1 for a shape
 * or cache format it does not take (H not a multiple of KV), -2 if out of memory. */
int inferd_paged_attention(const float* q, const void* k_pool, const void* v_pool,
                           const KeyPlan* plan, const AttentionShape* shape, float* out) {
    const int64_t H = shape->heads, KV = shape->kv_heads;
    const int64_t format = shape->cache_format, D = shape->head_dim;
    if (KV < 1 || H % KV) return -1;
    if (format != CACHE_F32 && format != CACHE_BF16 && format != CACHE_INT8) return -1;
    const Problem P = {q,      k_pool, v_pool, plan, H, KV, D, H / KV, shape->window, format,
                       kv_row_width(format, D), shape->scale, shape->softcap, shape->sinks};
    int64_t count = 0, tall = 1;
    Tile* tiles = make_tiles(&P, &count, &tall);
    if (!tiles) return -2;
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    const int64_t units = count * KV, target = 4 * (int64_t)threads;
    int rc = 0;
    if (units >= target)
        rc = by_units(&P, tiles, units, tall, out);
    else if (units > 0)
        rc = by_chunks(&P, tiles, units, tall, (target + units - 1) / units, out);
    free(tiles);
    return rc;
}

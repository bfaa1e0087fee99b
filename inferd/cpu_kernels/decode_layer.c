/* One decoder layer of a step in a single call (inferd: every step of a model on GGUF blocks).
 *
 * In PyTorch a layer is ~45 small ops plus the Python around them: ~250 us per layer for one
 * sequence, more than its weights take to read. Here the same computation runs in C between the
 * block products (block_gemv.c) and the attention (decode_attention.c):
 *
 *   x = norm(h); q, k, v = x W_qkv (+ bias); q, k = rope(norm_qk(q, k)); cache <- k, v
 *   a = attention(q) W_o;  Gemma: h += norm(a), x = norm(h);  Llama: h += a, x = norm(h)
 *   m = (act(x W_gate) * x W_up) W_down;  Gemma: h += norm(m);  Llama: h += m
 *   (Granite: a and m times its residual multiplier before they are added)
 *
 * All in float32; the norms follow rms_norm.c. Sizes come from the layer description below,
 * which Python fills once per layer (inferd/models/cpu_decoder.py). A step is any number of
 * rows, each one new token of some sequence at its own position: decode rows, the rows of
 * prefill chunks, speculative verification rows, mixed. NOTE: every operation here, like the
 * block products and the attention, gives a row the same bits whatever the other rows are. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "kv_int8.h"
#include "vec_exp.h"

#define MAX_PARTS 4

/* A projection: row ranges stacked along the output (q/k/v of different GGUF types). */
typedef struct {
    int64_t count;
    BlockMatrix parts[MAX_PARTS];
} BlockLinear;

typedef struct {
    int64_t hidden, heads, kv_heads, head_dim, inter;
    int64_t gelu;     /* 1: gelu (tanh approximation), 0: silu */
    int64_t sandwich; /* 1: Gemma's norms after attention and MLP too */
    int64_t window;   /* 0: none */
    float eps, scale, softcap; /* softcap 0: none */
    float residual;            /* each branch's output multiplier before the add (Granite), or 1 */
    BlockLinear qkv, o, gate_up, down;
    const float* qkv_bias;       /* or NULL */
    const float* input_gain;     /* [hidden] */
    const float* post_attn_gain; /* [hidden]: Gemma's post-attention norm; Llama: pre-MLP */
    const float* pre_ffn_gain;   /* [hidden] (Gemma) */
    const float* post_ffn_gain;  /* [hidden] (Gemma) */
    const float* qk_gain;        /* [heads + kv_heads, head_dim] or NULL */
    LoraLinear lora_qkv, lora_o, lora_gate_up, lora_down; /* slots 0: no adapters */
} LayerSpec;

typedef struct {
    int64_t n;             /* rows: one new token each, of any sequences, in any mix */
    const float* cos;      /* [n, head_dim] */
    const float* sin;      /* [n, head_dim], signed: the first half negated */
    void* k_pool;          /* [num_blocks, block_size, kv_heads, kv_row_width(format, head_dim)] */
    void* v_pool;
    int64_t cache_format;  /* CACHE_F32, CACHE_BF16 or CACHE_INT8 (kv_int8.h) */
    const int64_t* slots;  /* [n] cache slot of each new token */
    const KeyPlan* keys;   /* which keys each row attends to (decode_attention.c) */
    const int64_t* adapter; /* [n] each row's LoRA slot (0: base model), or NULL: none */
} StepSpec;

/* From this many rows, the per-row work between the products is spread over the threads (a
 * row's arithmetic is the same either way). */
#define PARALLEL_ROWS 8

static int gemv(const BlockLinear* W, const float* x, int64_t n, float* y) {
    int64_t total = 0, first = 0;
    for (int64_t i = 0; i < W->count; i++) total += W->parts[i].N;
    for (int64_t i = 0; i < W->count; i++) {
        const int rc = inferd_block_gemv(x, n, &W->parts[i], y + first, total);
        if (rc) return rc;
        first += W->parts[i].N;
    }
    return 0;
}

/* cos [n, 2 half] and signed sin [n, 2 half] (the first half negated) of the angles
 * positions[i] * inv_freq[d], as RotaryEmbedding.cos_sin lays them out (inferd/layers/rotary.py).
 * NOTE: libm's cosf and sinf, one value at a time, so that a position's table never depends on
 * the other positions of the step (PyTorch's vectorised sin and its scalar tail can round
 * differently, and where the tail falls depends on the tensor's size and the threads). */
void inferd_rope_tables(const int64_t* positions, int64_t n, const float* inv_freq, int64_t half,
                        float* cos, float* sin) {
#pragma omp parallel for if (n >= 64) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float* c = cos + i * 2 * half;
        float* s = sin + i * 2 * half;
        const float p = (float)positions[i];
        for (int64_t d = 0; d < half; d++) {
            const float angle = p * inv_freq[d];
            c[d] = c[d + half] = cosf(angle);
            s[d + half] = sinf(angle);
            s[d] = -s[d + half];
        }
    }
}

/* x * cos + swap_halves(x) * signed_sin, per head, in place */
static void rope(float* x, int64_t heads, int64_t D, const float* restrict cos,
                 const float* restrict sin) {
    const int64_t half = D / 2;
    for (int64_t h = 0; h < heads; h++) {
        float* v = x + h * D;
        for (int64_t d = 0; d < half; d++) {
            const float a = v[d], b = v[d + half];
            v[d] = a * cos[d] + b * sin[d];
            v[d + half] = b * cos[d + half] + a * sin[d + half];
        }
    }
}

/* GELU's tanh approximation, 0.5 x (1 + tanh(u)), written as x / (1 + e^(-2u)) (the same
 * function: 1 + tanh(u) = 2 / (1 + e^(-2u))) so that it needs only e^x, which vectorises. */
static inline float gelu_tanh(float x) {
    const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x); /* sqrt(2 / pi) (...) */
    return x / (1.0f + inferd_exp(-2.0f * u));
}

static inline float silu(float x) { return x / (1.0f + inferd_exp(-x)); }

static inline uint16_t to_bf16(float f) { /* round to nearest even, as PyTorch does */
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((bits >> 16) | 0x40); /* NaN */
    return (uint16_t)((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

/* One token's KV heads x [KV, D] into its cache rows, which start at element `at`. */
static void store(void* pool, int64_t format, int64_t at, const float* x, int64_t KV,
                  int64_t D) {
    if (format == CACHE_F32) {
        memcpy((float*)pool + at, x, sizeof(float) * (size_t)(KV * D));
    } else if (format == CACHE_INT8) { /* a scale per head: kv_int8.h */
        for (int64_t h = 0; h < KV; h++)
            kv_int8_quantize(x + h * D, D, (int8_t*)pool + at + h * (D + KV_INT8_SCALE_BYTES));
    } else {
        uint16_t* out = (uint16_t*)pool + at;
        for (int64_t c = 0; c < KV * D; c++) out[c] = to_bf16(x[c]);
    }
}

/* Row i of the projected q/k/v: bias, q/k norms, rotation; q into `q`, k and v into the cache. */
static void qkv_row(const LayerSpec* L, const StepSpec* S, int64_t i, float* row, float* q) {
    const int64_t H = L->heads, KV = L->kv_heads, D = L->head_dim, width = (H + 2 * KV) * D;
    if (L->qkv_bias)
        for (int64_t c = 0; c < width; c++) row[c] += L->qkv_bias[c];
    if (L->qk_gain) { /* per-head norms of q and k, each head with its own gain row */
        for (int64_t hd = 0; hd < H + KV; hd++) {
            inferd_rms_norm(row + hd * D, NULL, 1, D, L->eps, row + hd * D);
            for (int64_t d = 0; d < D; d++) row[hd * D + d] *= L->qk_gain[hd * D + d];
        }
    }
    rope(row, H + KV, D, S->cos + i * D, S->sin + i * D);
    memcpy(q + i * H * D, row, sizeof(float) * (size_t)(H * D));
    const int64_t at = S->slots[i] * KV * kv_row_width(S->cache_format, D);
    store(S->k_pool, S->cache_format, at, row + H * D, KV, D);
    store(S->v_pool, S->cache_format, at, row + (H + KV) * D, KV, D);
}

/* act [I] = act(gate) * up of one row of gate_up [2I] */
/* NOTE: GCC's jump threading copies inferd_exp's clamps into separate paths and then computes
 * the division twice per vector (two vdivps); without it the loops take one. Same arithmetic,
 * same bits; ~5% of a 512-token prefill step with GELU. */
#if defined(__GNUC__) && !defined(__clang__)
#define ONE_DIVISION __attribute__((noinline, optimize("no-thread-jumps")))
#else
#define ONE_DIVISION
#endif

ONE_DIVISION static void gated_row(const LayerSpec* L, const float* restrict g,
                                   float* restrict out) {
    const int64_t I = L->inter;
    /* two loops rather than a test per value, so that each vectorises */
    if (L->gelu)
        for (int64_t c = 0; c < I; c++) out[c] = gelu_tanh(g[c]) * g[I + c];
    else
        for (int64_t c = 0; c < I; c++) out[c] = silu(g[c]) * g[I + c];
}

/* h += y * s: the product rounded, then the sum, as PyTorch computes `h + y * s` */
static void add(float* restrict h, const float* restrict y, int64_t count, float s) {
    if (s == 1.0f) {
#pragma omp parallel for if (count >= PARALLEL_ROWS * 1024) schedule(static)
        for (int64_t c = 0; c < count; c++) h[c] += y[c];
        return;
    }
#pragma omp parallel for if (count >= PARALLEL_ROWS * 1024) schedule(static)
    for (int64_t c = 0; c < count; c++) h[c] += y[c] * s;
}

/* Rows of a step that take the second half of a layer (from the attention's output on)
 * together: their intermediates (the MLP's 2 x inter values a row above all) stay in cache
 * instead of making a round trip to memory, and a step of many rows needs that much scratch
 * only once. A multiple of every variant's largest block-product tile (block_gemv.c). */
#define ROW_BLOCK 96

/* Rows r0 .. r0 + m - 1 from the attention's output `att` on: the output projection, the
 * residuals, norms and the MLP, into h. `x`, `y`: [m, hidden]; `mlp` [m, 2 inter]; `act`
 * [m, inter]. */
static int layer_tail(const LayerSpec* L, const float* att, int64_t m, const int64_t* adapter,
                      float* h, float* x, float* y, float* mlp, float* act) {
    const int64_t hid = L->hidden, I = L->inter;
    int rc;
    if ((rc = gemv(&L->o, att, m, y))) return rc;
    if ((rc = inferd_lora_add(&L->lora_o, adapter, att, m, y))) return rc;
    if (L->sandwich) {
        inferd_rms_norm(y, L->post_attn_gain, m, hid, L->eps, y);
        add(h, y, m * hid, L->residual);
        inferd_rms_norm(h, L->pre_ffn_gain, m, hid, L->eps, x);
    } else {
        add(h, y, m * hid, L->residual);
        inferd_rms_norm(h, L->post_attn_gain, m, hid, L->eps, x);
    }
    if ((rc = gemv(&L->gate_up, x, m, mlp))) return rc;
    if ((rc = inferd_lora_add(&L->lora_gate_up, adapter, x, m, mlp))) return rc;
#pragma omp parallel for if (m >= PARALLEL_ROWS) schedule(static)
    for (int64_t i = 0; i < m; i++) gated_row(L, mlp + i * 2 * I, act + i * I);
    if ((rc = gemv(&L->down, act, m, y))) return rc;
    if ((rc = inferd_lora_add(&L->lora_down, adapter, act, m, y))) return rc;
    if (L->sandwich) inferd_rms_norm(y, L->post_ffn_gain, m, hid, L->eps, y);
    add(h, y, m * hid, L->residual);
    return 0;
}

/* h [n, hidden] in place. Returns 0, or the first failing kernel's code. NOTE: every row's keys
 * and values are in the cache before any row attends, so row j of a prefill chunk finds rows
 * before it (causal attention over the chunk). Every row's result is the same whichever block
 * of ROW_BLOCK rows it falls in. */
int inferd_decode_layer(const LayerSpec* L, const StepSpec* S, float* h) {
    const int64_t n = S->n, H = L->heads, KV = L->kv_heads, D = L->head_dim;
    const int64_t qkv_width = (H + 2 * KV) * D, hid = L->hidden, I = L->inter;
    const int64_t block = n < ROW_BLOCK ? n : ROW_BLOCK;
    float* x = malloc(sizeof(float) * (size_t)(n * hid));
    float* qkv = malloc(sizeof(float) * (size_t)(n * qkv_width)); /* then the attention's out */
    float* q = malloc(sizeof(float) * (size_t)(n * H * D));
    float* y = malloc(sizeof(float) * (size_t)(block * hid));
    float* mlp = malloc(sizeof(float) * (size_t)(block * 2 * I));
    float* act = malloc(sizeof(float) * (size_t)(block * I));
    int rc = -2;
    if (!x || !qkv || !q || !y || !mlp || !act) goto done;
    const AttentionShape shape = {H, KV, D, L->window, S->cache_format, L->scale, L->softcap};

    inferd_rms_norm(h, L->input_gain, n, hid, L->eps, x);
    if ((rc = gemv(&L->qkv, x, n, qkv))) goto done;
    if ((rc = inferd_lora_add(&L->lora_qkv, S->adapter, x, n, qkv))) goto done;
#pragma omp parallel for if (n >= PARALLEL_ROWS) schedule(static)
    for (int64_t i = 0; i < n; i++) qkv_row(L, S, i, qkv + i * qkv_width, q);
    float* att = qkv; /* q, k and v are out of it: the rows' attention takes its place */
    if ((rc = inferd_paged_attention(q, S->k_pool, S->v_pool, S->keys, &shape, att))) goto done;
    for (int64_t r0 = 0; r0 < n; r0 += block) {
        const int64_t m = n - r0 < block ? n - r0 : block;
        const int64_t* adapter = S->adapter ? S->adapter + r0 : NULL;
        rc = layer_tail(L, att + r0 * H * D, m, adapter, h + r0 * hid, x, y, mlp, act);
        if (rc) goto done;
    }
    rc = 0;
done:
    free(x); free(qkv); free(q); free(y); free(mlp); free(act);
    return rc;
}

/* Layers 0 .. count - 1 of a step in one call, layer i described by layers[i] and steps[i]
 * (the step as that layer sees it: its rotary tables, caches, slots and key plans), h in
 * place. The same arithmetic as calling inferd_decode_layer for each: one call per step saves
 * the Python between layers (~20 us a layer for a one-row step, whose layers take ~200 us).
 * Returns 0, or the first failing layer's code. */
int inferd_decode_layers(int64_t count, const LayerSpec* const* layers,
                         const StepSpec* const* steps, float* h) {
    for (int64_t i = 0; i < count; i++) {
        const int rc = inferd_decode_layer(layers[i], steps[i], h);
        if (rc) return rc;
    }
    return 0;
}

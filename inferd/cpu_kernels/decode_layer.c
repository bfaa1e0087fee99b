/* One decoder layer of a decode step in a single call (inferd, `--quantization gguf`).
 *
 * In PyTorch a layer is ~45 small ops plus the Python around them: ~250 us per layer for one
 * sequence, more than its weights take to read. Here the same computation runs in C between the
 * block products (block_gemv.c) and the attention (decode_attention.c):
 *
 *   x = norm(h); q, k, v = x W_qkv (+ bias); q, k = rope(norm_qk(q, k)); cache <- k, v
 *   a = attention(q) W_o;  Gemma: h += norm(a), x = norm(h);  Llama: h += a, x = norm(h)
 *   m = (act(x W_gate) * x W_up) W_down;  Gemma: h += norm(m);  Llama: h += m
 *
 * All in float32; the norms follow rms_norm.c. Sizes come from the layer description below,
 * which Python fills once per layer (inferd/models/cpu_decoder.py). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
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
    BlockLinear qkv, o, gate_up, down;
    const float* qkv_bias;       /* or NULL */
    const float* input_gain;     /* [hidden] */
    const float* post_attn_gain; /* [hidden]: Gemma's post-attention norm; Llama: pre-MLP */
    const float* pre_ffn_gain;   /* [hidden] (Gemma) */
    const float* post_ffn_gain;  /* [hidden] (Gemma) */
    const float* qk_gain;        /* [heads + kv_heads, head_dim] or NULL */
} LayerSpec;

typedef struct {
    int64_t n;              /* sequences, one new token each */
    const float* cos;       /* [n, head_dim] */
    const float* sin;       /* [n, head_dim], signed: the first half negated */
    float* k_pool;          /* [num_blocks, block_size, kv_heads, head_dim] */
    float* v_pool;
    int64_t block_size;
    const int64_t* slots;   /* [n] cache slot of each new token */
    const int64_t* blocks;  /* [n, width] (see decode_attention.c) */
    const int64_t* starts;  /* [n] */
    const int64_t* lens;    /* [n] */
    int64_t width;
} StepSpec;

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

/* h [n, hidden] in place. Returns 0, or the first failing kernel's code. */
int inferd_decode_layer(const LayerSpec* L, const StepSpec* S, float* h) {
    const int64_t n = S->n, H = L->heads, KV = L->kv_heads, D = L->head_dim;
    const int64_t qkv_width = (H + 2 * KV) * D, hid = L->hidden;
    float* x = malloc(sizeof(float) * (size_t)(n * hid));
    float* qkv = malloc(sizeof(float) * (size_t)(n * qkv_width));
    float* att = malloc(sizeof(float) * (size_t)(n * H * D));
    float* q = malloc(sizeof(float) * (size_t)(n * H * D));
    float* y = malloc(sizeof(float) * (size_t)(n * hid));
    float* mlp = malloc(sizeof(float) * (size_t)(n * 2 * L->inter));
    int rc = -2;
    if (!x || !qkv || !att || !q || !y || !mlp) goto done;

    inferd_rms_norm(h, L->input_gain, n, hid, L->eps, x);
    if ((rc = gemv(&L->qkv, x, n, qkv))) goto done;
    for (int64_t i = 0; i < n; i++) {
        float* row = qkv + i * qkv_width;
        if (L->qkv_bias)
            for (int64_t c = 0; c < qkv_width; c++) row[c] += L->qkv_bias[c];
        if (L->qk_gain) { /* per-head norms of q and k, each head with its own gain row */
            for (int64_t hd = 0; hd < H + KV; hd++) {
                inferd_rms_norm(row + hd * D, NULL, 1, D, L->eps, row + hd * D);
                for (int64_t d = 0; d < D; d++) row[hd * D + d] *= L->qk_gain[hd * D + d];
            }
        }
        rope(row, H + KV, D, S->cos + i * D, S->sin + i * D);
        memcpy(q + i * H * D, row, sizeof(float) * (size_t)(H * D));
        const int64_t slot = S->slots[i];
        memcpy(S->k_pool + slot * KV * D, row + H * D, sizeof(float) * (size_t)(KV * D));
        memcpy(S->v_pool + slot * KV * D, row + (H + KV) * D, sizeof(float) * (size_t)(KV * D));
    }
    if ((rc = inferd_decode_attention(q, S->k_pool, S->v_pool, S->blocks, S->starts, S->lens, n,
                                      S->width, S->block_size, H, KV, D, L->scale, L->window,
                                      L->softcap, 0, att)))
        goto done;
    if ((rc = gemv(&L->o, att, n, y))) goto done;
    if (L->sandwich) {
        inferd_rms_norm(y, L->post_attn_gain, n, hid, L->eps, y);
        for (int64_t c = 0; c < n * hid; c++) h[c] += y[c];
        inferd_rms_norm(h, L->pre_ffn_gain, n, hid, L->eps, x);
    } else {
        for (int64_t c = 0; c < n * hid; c++) h[c] += y[c];
        inferd_rms_norm(h, L->post_attn_gain, n, hid, L->eps, x);
    }
    if ((rc = gemv(&L->gate_up, x, n, mlp))) goto done;
    const int64_t I = L->inter;
    for (int64_t i = 0; i < n; i++) { /* act(gate) * up, into the gate half */
        float* g = mlp + i * 2 * I;
        /* two loops rather than a test per value, so that each vectorises */
        if (L->gelu)
            for (int64_t c = 0; c < I; c++) g[c] = gelu_tanh(g[c]) * g[I + c];
        else
            for (int64_t c = 0; c < I; c++) g[c] = silu(g[c]) * g[I + c];
    }
    /* the down projection reads rows of 2I floats; pack the gated halves together first */
    for (int64_t i = 1; i < n; i++) memmove(mlp + i * I, mlp + i * 2 * I, sizeof(float) * I);
    if ((rc = gemv(&L->down, mlp, n, y))) goto done;
    if (L->sandwich) inferd_rms_norm(y, L->post_ffn_gain, n, hid, L->eps, y);
    for (int64_t c = 0; c < n * hid; c++) h[c] += y[c];
    rc = 0;
done:
    free(x); free(qkv); free(att); free(q); free(y); free(mlp);
    return rc;
}

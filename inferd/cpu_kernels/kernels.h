/* What the C kernels share (inferd). The structs are mirrored by ctypes classes in
 * inferd/layers/gguf_blocks.py and inferd/models/cpu_decoder.py: keep them in step. */
#ifndef INFERD_KERNELS_H
#define INFERD_KERNELS_H
#include <stdint.h>

/* One block-quantised matrix, or a row range of a stacked one, its rows in groups of 16 (the
 * last padded): the layout is block_gemv.c's opening comment. */
typedef struct {
    const uint8_t* q;     /* [ceil(N/16), 16 * K * bits / 8] (5 and 6 bits: their low 4) */
    const uint8_t* high;  /* 5 bits: [ceil(N/16), 2 K] fifth bits; 6 bits: [ceil(N/16), 4 K]
                           * the two high bits; else NULL */
    const void* scale;    /* [ceil(N/16), K / B, 16] fp16 or fp32; int8 with scale_super */
    const void* offset;   /* [ceil(N/16), K / B, 16] fp32, int8 with offset_super; or NULL */
    int64_t N, K, B, bits, zero, half_scales;
    /* Factored scales (K a multiple of 256): scale[n, b] = scale_super[n, b B / 256] times the
     * int8 in `scale`, [ceil(N/16), K / 256, 16]; NULL: `scale` holds the scales. The same for
     * offsets. */
    const float* scale_super;
    const float* offset_super;
    const int8_t* codebook; /* 16 values: q = codebook[its 4-bit index] (bits 4, zero 0); or NULL */
} BlockMatrix;

int inferd_block_gemv(const float* x, int64_t M, const BlockMatrix* W, float* y, int64_t ldy);
void inferd_block_dequantize(const BlockMatrix* W, int64_t first, int64_t rows, int64_t bf16,
                             void* out);
void inferd_rms_norm(const float* x, const float* gain, int64_t rows, int64_t dim, float eps,
                     float* out);
/* Which cached keys each query row of a step sees, for the layers of one KV group (built once
 * per step: inferd/attention/cpu_backend.py). Row i belongs to the sequence s with
 * seq_rows[s] <= i < seq_rows[s + 1] and sees positions up to lens[i] - 1 (inside the window, if
 * the layer has one); the sequence's positions from starts[s] on are in the cache blocks
 * blocks[s, 0 ..] (block_size slots each). */
typedef struct {
    int64_t rows, seqs;
    const int64_t* seq_rows; /* [seqs + 1] */
    const int64_t* lens;     /* [rows] */
    const int64_t* blocks;   /* [seqs, width] */
    const int64_t* starts;   /* [seqs] */
    int64_t width, block_size;
} KeyPlan;

/* One attention layer: window 0 for none, softcap 0 for none; sinks NULL for none, else one
 * logit per query head that joins each row's softmax denominator (gpt-oss). cache_format: what
 * the pools hold, CACHE_F32, CACHE_BF16 or CACHE_INT8 (kv_int8.h). */
typedef struct {
    int64_t heads, kv_heads, head_dim, window, cache_format;
    float scale, softcap;
    const float* sinks;
} AttentionShape;

int inferd_paged_attention(const float* q, const void* k_pool, const void* v_pool,
                           const KeyPlan* plan, const AttentionShape* shape, float* out);
/* The LoRA adapters resident in slots for one projection (inferd/layers/lora.py lays them out):
 * part j of a fused projection has rank columns j*rank .. (j+1)*rank - 1 of A and B, and B's
 * rows there reach only the part's output columns cols[j] .. cols[j+1] - 1. */
#define INFERD_LORA_MAX_PARTS 4
typedef struct {
    int64_t slots; /* 0: the projection has no adapters */
    int64_t in, out, rank, parts;
    int64_t cols[INFERD_LORA_MAX_PARTS + 1];
    const float* a; /* [slots, in, parts * rank] */
    const float* b; /* [slots, parts * rank, out], the adapter's scale folded in */
} LoraLinear;

int inferd_lora_add(const LoraLinear* W, const int64_t* adapter, const float* x, int64_t n,
                    float* y);
void inferd_argmax_rows(const float* x, int64_t rows, int64_t cols, int64_t* out);
/* FP8 (e4m3fn) weights as stored, a scale per output row (inferd/layers/fp8_weight.py): the
 * layout and the numeric definition are fp8_gemm.c's opening comment. */
typedef struct {
    const uint8_t* codes; /* [ceil(N/16), K, 16] */
    const float* scale;   /* [ceil(N/16) * 16]: 256 * the row's scale, NaN for a row holding a NaN
                           * code; 0 past N */
    int64_t N, K;
} Fp8Matrix;

int inferd_fp8_gemm(const float* x, int64_t M, const Fp8Matrix* W, float* y, int64_t ldy);
#endif

/* What the C kernels share (inferd). The structs are mirrored by ctypes classes in
 * inferd/layers/gguf_blocks.py and inferd/models/cpu_decoder.py: keep them in step. */
#ifndef INFERD_KERNELS_H
#define INFERD_KERNELS_H
#include <stdint.h>

/* One block-quantised matrix, or a row range of a stacked one, its rows in groups of 16 (the
 * last padded): the layout is block_gemv.c's opening comment. */
typedef struct {
    const uint8_t* q;     /* [ceil(N/16), 16 * K * bits / 8] (5 bits: their low 4) */
    const uint8_t* high;  /* 5 bits: [ceil(N/16), 2 K] fifth bits, else NULL */
    const void* scale;    /* [ceil(N/16), K / B, 16] fp16 or fp32 */
    const float* offset;  /* [ceil(N/16), K / B, 16] or NULL */
    int64_t N, K, B, bits, zero, half_scales;
} BlockMatrix;

int inferd_block_gemv(const float* x, int64_t M, const BlockMatrix* W, float* y, int64_t ldy);
void inferd_block_dequantize(const BlockMatrix* W, int64_t first, int64_t rows, int64_t bf16,
                             void* out);
void inferd_rms_norm(const float* x, const float* gain, int64_t rows, int64_t dim, float eps,
                     float* out);
int inferd_decode_attention(const float* q, const void* k_pool, const void* v_pool,
                            const int64_t* blocks, const int64_t* starts, const int64_t* lens,
                            int64_t n, int64_t width, int64_t bs, int64_t H, int64_t KV,
                            int64_t D, float scale, int64_t window, float softcap,
                            int64_t cache_bf16, float* out);
void inferd_argmax_rows(const float* x, int64_t rows, int64_t cols, int64_t* out);
#endif

/* The int8 KV cache row (inferd): head_dim int8 codes, then their float32 scale's 4 bytes
 * (little-endian, at any alignment). The numeric definition and why it is per token and KV
 * head are inferd/kv_int8.py's opening comment; PyTorch's `quantize` there performs the same
 * IEEE operations as `kv_int8_quantize` here (float32 max, one division for the scale and one
 * per value, round half to even), so both write the same bytes, and `kv_int8_dequantize` the
 * same product as its `dequantize`. Nothing here depends on the ISA variant's vector width: the
 * compiler may vectorise the loops, and each value's operations stay the same. */
#ifndef INFERD_KV_INT8_H
#define INFERD_KV_INT8_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#define KV_INT8_SCALE_BYTES 4

/* The cache formats of KV pools (AttentionShape.cache_format, StepSpec.cache_format). */
enum { CACHE_F32 = 0, CACHE_BF16 = 1, CACHE_INT8 = 2 };

/* Elements (floats, bf16 values or bytes) of one cache row of D values. */
static inline int64_t kv_row_width(int64_t format, int64_t D) {
    return format == CACHE_INT8 ? D + KV_INT8_SCALE_BYTES : D;
}

/* x [D] -> row [D + 4]. An all-zero x gives codes 0 and scale 0. */
static inline void kv_int8_quantize(const float* x, int64_t D, int8_t* row) {
    float amax = 0.0f;
    for (int64_t d = 0; d < D; d++) {
        const float a = fabsf(x[d]);
        amax = a > amax ? a : amax;
    }
    const float scale = amax / 127.0f;
    const float divisor = scale > 0.0f ? scale : 1.0f;
    for (int64_t d = 0; d < D; d++) {
        float q = rintf(x[d] / divisor); /* the default rounding mode: to nearest, ties even */
        q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
        row[d] = (int8_t)q;
    }
    memcpy(row + D, &scale, KV_INT8_SCALE_BYTES);
}

/* row [D + 4] -> out [D]: code x scale. */
static inline void kv_int8_dequantize(const int8_t* row, int64_t D, float* out) {
    float scale;
    memcpy(&scale, row + D, KV_INT8_SCALE_BYTES);
    for (int64_t d = 0; d < D; d++) out[d] = (float)row[d] * scale;
}
#endif

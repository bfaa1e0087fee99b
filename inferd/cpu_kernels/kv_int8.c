/* kv_int8.h's row quantisation over many rows (inferd): the C decoder layer quantises the keys
 * and values it stores with the same inline function, and the tests hold this entry point to
 * PyTorch's `quantize` (inferd/kv_int8.py) byte for byte, in every ISA variant. */
#include <stdint.h>

#include "kv_int8.h"

/* x [n, D] float32 -> out [n, D + 4] int8 rows */
void inferd_kv_int8_quantize(const float* x, int64_t n, int64_t D, int8_t* out) {
#pragma omp parallel for if (n >= 64) schedule(static)
    for (int64_t i = 0; i < n; i++)
        kv_int8_quantize(x + i * D, D, out + i * (D + KV_INT8_SCALE_BYTES));
}

/* block_gemv.c's inner loop in plain C, for any CPU (inferd): the same exact integer block sums
 * as the SIMD versions, one weight row at a time. The compiler may vectorise it for the
 * baseline of its target (SSE2 on x86-64); no wider instructions are assumed. */
#include "block_layout.h"

#ifdef INFERD_ISA_PORTABLE

void unpack_chunk(const BlockMatrix* W, int64_t n, int64_t c, int64_t len, uint8_t* out) {
    if (W->bits == 8) {
        memcpy(out, W->q + chunk_at(W, n, c, 64), (size_t)len);
        return;
    }
    const uint8_t* p = W->q + chunk_at(W, n, c, 32); /* 4 and 5 bits: K % 64 == 0, len 64 */
    for (int j = 0; j < 32; j++) {
        out[j] = p[j] & 0xF;
        out[j + 32] = p[j] >> 4;
    }
    if (W->bits == 5) {
        const uint8_t* high = W->high + chunk_at(W, n, c, 8);
        for (int j = 0; j < 64; j++) out[j] |= (uint8_t)(((high[j / 8] >> (j % 8)) & 1) << 4);
    }
}

/* sum_j (w[j] - zero) * a[j] over one block, a the 16-bit activations (block_layout.h); the
 * zero point comes from xc. A loop the compiler vectorises for the baseline ISA. */
static inline int32_t block_sum(const uint8_t* w, const int16_t* a, int64_t B) {
    int32_t sum = 0;
    for (int64_t j = 0; j < B; j++) sum += (int32_t)w[j] * a[j];
    return sum;
}

static void row_dot(const BlockMatrix* W, int64_t n0, int64_t R, QuantRows x, int64_t M,
                    float* out) {
    const int64_t K = W->K, B = W->B;
    uint8_t unpacked[64];
    for (int64_t r = 0; r < R; r++) {
        const int64_t n = n0 + r;
        float total[MAX_ROWS] = {0};
        for (int64_t k = 0; k < K; k += 64) {
            const int64_t len = K - k >= 64 ? 64 : 32;
            const uint8_t* stored = unpacked;
            if (W->bits == 8)
                stored = W->q + chunk_at(W, n, k / 64, 64);
            else
                unpack_chunk(W, n, k / 64, len, unpacked);
            for (int64_t b = 0; b < len / B; b++) {
                const int64_t kb = k + b * B;
                const float s = scale_at(W, n * (K / B) + kb / B);
                for (int64_t m = 0; m < M; m++) {
                    /* the zero point: xc holds -zero * (the sum of each four activations) */
                    int32_t sum = block_sum(stored + b * B, x.xw + m * K + kb, B);
                    for (int64_t l = 0; l < B / 4; l++) sum += x.xc[(m * K + kb) / 4 + l];
                    total[m] += s * x.xl[(m * K + kb) / 4] * (float)sum;
                }
            }
        }
        for (int64_t m = 0; m < M; m++) out[m * R + r] = total[m];
    }
}

RowDot row_dot_for(const BlockMatrix* W) {
    (void)W;
    return row_dot;
}

int64_t rows_together(int64_t M) {
    (void)M;
    return 1;
}
#endif

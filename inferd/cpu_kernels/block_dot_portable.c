/* block_gemv.c's tile in plain C, for any CPU (inferd): the same exact integer block sums and
 * the same float operations per output as the SIMD tiles (fmaf for their fused multiply-adds),
 * so it gives the same bits. The compiler may vectorise the integer loops for the baseline of
 * its target (SSE2 on x86-64); no wider instructions are assumed. */
#include <math.h>

#include "block_layout.h"

#ifdef INFERD_ISA_PORTABLE

/* A panel of R rows against group g, a block of the group's weights unpacked at a time. */
static void group_product(const BlockMatrix* W, int64_t g, Panel x, int64_t R, float* y,
                          int64_t ldy) {
    const int64_t K = W->K, B = W->B, nb = K / B, at = group_scales(W, g);
    const int64_t n0 = g * GROUP, valid = W->N - n0 < GROUP ? W->N - n0 : GROUP;
    int16_t w[16][32]; /* the block's units (B / 2 <= 16), [unit][2r + i] */
    float acc[8][GROUP] = {{0}};
    for (int64_t b = 0; b < nb; b++) {
        for (int64_t u = 0; u < B / 2; u++) unpack_unit(W, g, b * (B / 2) + u, w[u]);
        for (int64_t m = 0; m < R; m++) {
            int32_t sum[GROUP] = {0}; /* unpack_unit removed the zero point already */
            for (int64_t u = 0; u < B / 2; u++) {
                int16_t a[2];
                memcpy(a, x.xw + (b * (B / 2) + u) * R + m, 4);
                for (int r = 0; r < GROUP; r++)
                    sum[r] += w[u][2 * r] * a[0] + w[u][2 * r + 1] * a[1];
            }
            const float d = x.dx[b * B / XBLOCK * R + m];
            for (int r = 0; r < GROUP; r++) {
                const float t = scale_at(W, at + b * GROUP + r) * d;
                acc[m][r] = fmaf((float)sum[r], t, acc[m][r]);
                if (W->offset)
                    acc[m][r] = fmaf(W->offset[at + b * GROUP + r], x.xo[b * R + m], acc[m][r]);
            }
        }
    }
    for (int64_t m = 0; m < R; m++)
        memcpy(y + m * ldy + n0, acc[m], sizeof(float) * (size_t)valid);
}

/* up to 8 rows against a block unpacked once */
int64_t tile_rows(int64_t left) { return left < 8 ? left : 8; }
int64_t tile_groups(int64_t M) {
    (void)M;
    return 1;
}

void tile_product(const BlockMatrix* W, int64_t g, int64_t groups, Panel x, int64_t R, float* y,
                  int64_t ldy, const void* unpacked) {
    (void)unpacked;
    for (int64_t j = 0; j < groups; j++) group_product(W, g + j, x, R, y, ldy);
}
#endif

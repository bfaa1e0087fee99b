/* block_gemv.c's tile in plain C, for any CPU (inferd): the same exact integer block sums and
 * the same float operations per output as the SIMD tiles (fmaf for their fused multiply-adds),
 * so it gives the same bits. No intrinsics: the loops are written so that a compiler vectorises
 * them for the baseline of its target (NEON on arm64, SSE2 on x86-64), which is what a CPU
 * without one of the x86 variants runs.
 *
 * NOTE: the shape is chosen for that. A weight block is unpacked once for the tile's rows, into
 * the inputs' even and odd weights apart, each a row of 16 int16 lanes (one per output row), so
 * the innermost loop is "16 int32 sums += 16 int16 weights x one int16 activation" twice: a
 * widening multiply by a scalar (NEON's smull/smlal) with no shuffles. The layout's interleaved
 * pairs (block_layout.h), multiplied as they were stored, left GCC a scalar loop: the embedded
 * model's LM head for 8 rows took 428 ms that way, 115 ms this way (AMD EPYC Zen 3, a plain
 * x86-64 build, two threads). GCC 12 for arm64 gives NEON for it as well. */
#include <math.h>

#include "block_layout.h"

#ifdef INFERD_ISA_PORTABLE

/* A weight block of one group: q (the zero point removed) of row r for inputs 2u and 2u + 1 of
 * the block's unit u, and the block's 16 scales (and offsets) as floats. */
typedef struct {
    int16_t even[16][GROUP]; /* B / 2 <= 16 units */
    int16_t odd[16][GROUP];
    float scale[GROUP];
    float offset[GROUP];
} Block;

/* Bits 0, 2, ..., 30 of x as bits 0 .. 15. */
static inline uint32_t even_bits(uint32_t x) {
    x &= 0x55555555u;
    x = (x | x >> 1) & 0x33333333u;
    x = (x | x >> 2) & 0x0F0F0F0Fu;
    x = (x | x >> 4) & 0x00FF00FFu;
    return (x | x >> 8) & 0x0000FFFFu;
}

/* Adds 16 to row r's q where bit r of `bits` is set (the fifth bit of a 5-bit weight). */
static inline void add_fifth(int16_t q[GROUP], uint32_t bits) {
    for (int r = 0; r < GROUP; r++) q[r] = (int16_t)(q[r] + ((bits & (1u << r)) ? 16 : 0));
}

/* The block's 16 scales or offsets as floats (block_layout.h's scale_at, offset_at), a loop
 * per form: one loop branching on the form per row was not vectorised, and the one-row
 * products of 8-bit and Q4_K weights took ~1.06x as long. */
static void block_floats(const void* values, const float* super, int half, int64_t at,
                         int64_t sup, float to[GROUP]) {
    if (super) {
        const int8_t* sub = (const int8_t*)values + at;
        for (int r = 0; r < GROUP; r++) to[r] = super[sup + r] * (float)sub[r];
    } else if (half) {
        for (int r = 0; r < GROUP; r++) to[r] = half_to_float(((const uint16_t*)values)[at + r]);
    } else {
        memcpy(to, (const float*)values + at, sizeof(float) * GROUP);
    }
}

static void unpack_block(const BlockMatrix* W, int64_t g, int64_t b, Block* out) {
    const int64_t B = W->B, units = B / 2, at = block_at(W, g, b), sup = super_at(W, g, b);
    const uint8_t* q = group_q(W, g);
    block_floats(W->scale, W->scale_super, (int)W->half_scales, at, sup, out->scale);
    if (W->offset) block_floats(W->offset, W->offset_super, 0, at, sup, out->offset);
    if (W->bits == 8) {
        for (int64_t u = 0; u < units; u++) {
            const int8_t* p = (const int8_t*)q + 32 * (b * units + u);
            for (int r = 0; r < GROUP; r++) {
                out->even[u][r] = p[2 * r];
                out->odd[u][r] = p[2 * r + 1];
            }
        }
        return;
    }
    /* 4, 5 and 6 bits (and indexes): chunk c's byte 2r + i holds unit c in its low nibble,
     * unit c + B/4 in its high one (block_layout.h) */
    const int16_t zero = (int16_t)W->zero;
    for (int64_t c = 0; c < B / 4; c++) {
        const uint8_t* p = q + 32 * (b * (B / 4) + c);
        for (int r = 0; r < GROUP; r++) {
            out->even[c][r] = (int16_t)((p[2 * r] & 0xF) - zero);
            out->odd[c][r] = (int16_t)((p[2 * r + 1] & 0xF) - zero);
            out->even[c + B / 4][r] = (int16_t)((p[2 * r] >> 4) - zero);
            out->odd[c + B / 4][r] = (int16_t)((p[2 * r + 1] >> 4) - zero);
        }
    }
    if (W->bits == 5) {
        const uint8_t* high = group_high(W, g);
        for (int64_t u = 0; u < units; u++) {
            const uint32_t fifth = fifth_bits(high, b * units + u); /* bit 2r + i */
            add_fifth(out->even[u], even_bits(fifth));
            add_fifth(out->odd[u], even_bits(fifth >> 1));
        }
    }
    if (W->bits == 6) { /* byte 2r + i of the 32 of chunks c - c % 2 and the next holds chunk
                         * c's units' two high bits from bit 4 (c % 2) (block_layout.h) */
        for (int64_t c = 0; c < B / 4; c++) {
            const uint8_t* h = group_high(W, g) + 32 * (b * (B / 8) + c / 2);
            const int shift = 4 * (int)(c % 2);
            for (int r = 0; r < GROUP; r++) {
                out->even[c][r] += (int16_t)(((h[2 * r] >> shift) & 3) << 4);
                out->odd[c][r] += (int16_t)(((h[2 * r + 1] >> shift) & 3) << 4);
                out->even[c + B / 4][r] += (int16_t)(((h[2 * r] >> (shift + 2)) & 3) << 4);
                out->odd[c + B / 4][r] += (int16_t)(((h[2 * r + 1] >> (shift + 2)) & 3) << 4);
            }
        }
    }
    if (W->codebook) /* the nibbles are indexes (zero 0): q = codebook[index] */
        for (int64_t u = 0; u < units; u++)
            for (int r = 0; r < GROUP; r++) {
                out->even[u][r] = W->codebook[out->even[u][r]];
                out->odd[u][r] = W->codebook[out->odd[u][r]];
            }
}

/* A panel of R rows against group g, a block of the group's weights unpacked at a time. */
static void group_product(const BlockMatrix* W, int64_t g, Panel x, int64_t R, float* y,
                          int64_t ldy) {
    const int64_t B = W->B, nb = W->K / B, units = B / 2;
    const int64_t n0 = g * GROUP, valid = W->N - n0 < GROUP ? W->N - n0 : GROUP;
    Block w;
    float acc[8][GROUP] = {{0}};
    for (int64_t b = 0; b < nb; b++) {
        unpack_block(W, g, b, &w);
        for (int64_t m = 0; m < R; m++) {
            int32_t sum[GROUP] = {0}; /* the zero point is removed already */
            for (int64_t u = 0; u < units; u++) {
                int16_t a[2];
                memcpy(a, x.xw + (b * units + u) * R + m, 4);
                const int16_t a0 = a[0], a1 = a[1];
#pragma omp simd
                for (int r = 0; r < GROUP; r++)
                    sum[r] += (int32_t)w.even[u][r] * a0 + (int32_t)w.odd[u][r] * a1;
            }
            const float d = x.dx[b * B / XBLOCK * R + m];
            for (int r = 0; r < GROUP; r++)
                acc[m][r] = fmaf((float)sum[r], w.scale[r] * d, acc[m][r]);
            if (W->offset) {
                const float xo = x.xo[b * R + m];
                for (int r = 0; r < GROUP; r++) acc[m][r] = fmaf(w.offset[r], xo, acc[m][r]);
            }
        }
    }
    for (int64_t m = 0; m < R; m++)
        memcpy(y + m * ldy + n0, acc[m], sizeof(float) * (size_t)valid);
}

/* up to 8 rows against a block unpacked once */
int64_t tile_rows(const BlockMatrix* W, int64_t left) {
    (void)W;
    return left < 8 ? left : 8;
}
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

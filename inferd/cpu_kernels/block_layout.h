/* What block_gemv.c shares with its per-ISA tiles (block_dot_*.c): where a weight's bytes are,
 * the quantised activations, the ISA this build targets, and the tile signature. Internal: not
 * part of the C ABI. block_gemv.c's opening comment describes the layout and the arithmetic. */
#ifndef INFERD_BLOCK_LAYOUT_H
#define INFERD_BLOCK_LAYOUT_H
#include <stdint.h>
#include <string.h>

#include "kernels.h"

/* Exactly one ISA per build, from the target flags build.py passes (variants.py):
 * AVX-512 needs F, BW and VL; AVX2 needs FMA and F16C; anything else is the portable C. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define INFERD_ISA_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define INFERD_ISA_AVX2 1
#else
#define INFERD_ISA_PORTABLE 1
#endif

#define GROUP 16  /* output rows per group: the 16 float lanes of a 512-bit vector */
#define XBLOCK 32 /* activation quantisation block */
#define RESIDUAL_SHIFT 8 /* q2 counts in steps of 1 / 256 of q1's */

/* A group's bytes in W->q: 16 rows x K weights, in 8 or 4 bits (5 and 6 bits: 4 here, the rest
 * in W->high). A unit is the 16 rows x 2 inputs (2u, 2u + 1) one int32 lane per row multiplies:
 * 8 bits, 32 bytes per unit (byte 2r + i = q of row r, input 2u + i, as int8); 4/5/6 bits,
 * 32 bytes per chunk c of block b, byte 2r + i holding unit b*B/2 + c in its low nibble and unit
 * b*B/2 + c + B/4 in its high one (both units of a chunk in one block). With W->codebook the
 * nibbles are indexes: q = codebook[nibble].
 * W->high, 5 bits: one uint32 per unit, bit 2r + i the fifth bit of byte 2r + i's value.
 * W->high, 6 bits: per block b and pair of chunks (2p, 2p + 1), 32 bytes, byte 2r + i holding
 * the two high bits of four units' values, from bit 0: chunk 2p's low nibble's unit, its high
 * nibble's, chunk 2p + 1's low nibble's, its high nibble's (HIGH2_SHIFT). Why: a byte widened
 * to an int16 lane then serves four units, each taking its bits to 4-5 with a shift and an AND
 * (one fewer for the third); bit planes, as for 5 bits, took a mask or a sign per unit and bit
 * (AVX2: 4 vector operations per half unit and plane, against ~2.75 for both bits here). */
static inline const uint8_t* group_q(const BlockMatrix* W, int64_t g) {
    return W->q + g * (W->bits == 8 ? 16 : 8) * W->K;
}

static inline const uint8_t* group_high(const BlockMatrix* W, int64_t g) {
    return W->high + g * (W->bits == 6 ? 4 : 2) * W->K; /* 5 bits: K / 2 units of 4 bytes */
}

/* How far right a byte of 6-bit high bits (widened to an int16 lane) is shifted to bring the
 * bits of its unit k (0-3: chunk 2p's low nibble, its high, chunk 2p + 1's low, its high) to
 * bits 4-5; negative: to the left. */
#define HIGH2_SHIFT(k) (2 * (k) - 4)

/* How a tile reads q, a constant in each of its instantiations: the width W->bits (4, 5, 6 or
 * 8), or CODED for 4-bit indexes into W->codebook. */
#define CODED 1
static inline int q_format(const BlockMatrix* W) { return W->codebook ? CODED : (int)W->bits; }

/* A group's 16 block scales (then offsets) are contiguous: [N/16, K/B, 16]; factored, their
 * super-block factors likewise, [N/16, K/256, 16]. */
static inline int64_t group_scales(const BlockMatrix* W, int64_t g) {
    return g * W->K / W->B * GROUP;
}

static inline int64_t group_supers(const BlockMatrix* W, int64_t g) {
    return g * W->K / 256 * GROUP;
}

static inline uint32_t fifth_bits(const uint8_t* high, int64_t u) {
    const uint8_t* p = high + 4 * u; /* little-endian, whatever the host */
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* q (the zero point removed) of unit u of group g: out[2r + i] = q[16g + r, 2u + i]. Plain C,
 * for dequantisation (the portable tile unpacks a block at a time, block_dot_portable.c). */
static inline void unpack_unit(const BlockMatrix* W, int64_t g, int64_t u, int16_t out[32]) {
    const uint8_t* q = group_q(W, g);
    if (W->bits == 8) {
        for (int j = 0; j < 32; j++) out[j] = (int8_t)q[32 * u + j];
        return;
    }
    const int64_t B = W->B, b = u / (B / 2), within = u % (B / 2), c = within % (B / 4);
    const uint8_t* chunk = q + 32 * (b * (B / 4) + c);
    const int nibble = within < B / 4 ? 0 : 1;
    const uint32_t fifth = W->bits == 5 ? fifth_bits(group_high(W, g), u) : 0;
    const uint8_t* high2 = W->bits == 6 ? group_high(W, g) + 32 * (b * (B / 8) + c / 2) : NULL;
    const int k = 2 * (int)(c % 2) + nibble; /* this unit's bits in a byte of high2 */
    for (int j = 0; j < 32; j++) {
        int s = (chunk[j] >> 4 * nibble) & 0xF;
        if (W->bits == 5) s |= (int)((fifth >> j) & 1) << 4;
        if (high2) s |= ((high2[j] >> 2 * k) & 3) << 4;
        out[j] = (int16_t)(W->codebook ? W->codebook[s] : s - W->zero);
    }
}

static inline float half_to_float(uint16_t h) {
#if defined(__aarch64__)
    /* arm64 converts in hardware (fcvt; the portable tile's loop of them vectorises): exact,
     * as below, so the same value */
    __fp16 f;
    memcpy(&f, &h, 2);
    return (float)f;
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else if (exp) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man) { /* subnormal: normalise */
        exp = 113;
        while (!(man & 0x400)) man <<= 1, exp--;
        bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

/* Where weight block b of group g has its 16 scales (and offsets) and their super-block
 * factors: W->scale[i + r] and W->scale_super[s + r] are row r's. */
static inline int64_t block_at(const BlockMatrix* W, int64_t g, int64_t b) {
    return group_scales(W, g) + b * GROUP;
}

static inline int64_t super_at(const BlockMatrix* W, int64_t g, int64_t b) {
    return group_supers(W, g) + b * W->B / 256 * GROUP;
}

/* The scale (offset) at i (and s), as a float. Factored: the float32 product of its two
 * factors, which gguf_blocks.py stores only where it is the scale bit for bit (a K-quant's: an
 * fp16 value times an integer of at most 8 bits, exact). */
static inline float scale_at(const BlockMatrix* W, int64_t i, int64_t s) {
    if (W->half_scales) return half_to_float(((const uint16_t*)W->scale)[i]);
    if (W->scale_super) return W->scale_super[s] * (float)((const int8_t*)W->scale)[i];
    return ((const float*)W->scale)[i];
}

static inline float offset_at(const BlockMatrix* W, int64_t i, int64_t s) {
    if (!W->offset) return 0.0f;
    if (W->offset_super) return W->offset_super[s] * (float)((const int8_t*)W->offset)[i];
    return ((const float*)W->offset)[i];
}

/* The bytes of a scale: 4, 2 (fp16) or 1 (an int8 factor). */
static inline int scale_bytes(const BlockMatrix* W) {
    return W->scale_super ? 1 : W->half_scales ? 2 : 4;
}

/* Asks for a group's bytes PREFETCH_AHEAD bytes of its q beyond weight block b, and for the
 * high bits and scales of the block as far ahead (q, high: group_q, group_high; scales: the
 * group's first scale, of `size` bytes each, scale_bytes). The tiles work the scales' address
 * out once: per block, it took 8 instructions of ~120 in a one-row AVX2 tile. NOTE: the hardware's prefetchers alone left the products short of the
 * memory's bandwidth: on a 2-core Intel Xeon (AVX-512 tiles, two threads) the LM head of one
 * row went from 9.2 to 6.7 ms with this (a plain read of as many bytes takes 6.2 ms there), a
 * decode step of 8 sequences from 26.5 to 16.7 ms and a 512-token prefill step from ~400 to
 * ~350 ms. A prefetch never faults, so asking past the end of the weights is harmless. */
#define PREFETCH_AHEAD 2048

/* NOTE: always inlined: out of line, GCC finds it without effects and deletes its calls. */
static inline __attribute__((always_inline)) void prefetch_block(
    const uint8_t* q, const uint8_t* high, const char* scales, int size, int64_t b, int bits,
    int B) {
    const int block_bytes = bits == 8 ? GROUP * B : GROUP * B / 2;
    const int64_t ahead = b + PREFETCH_AHEAD / block_bytes;
    for (int l = 0; l < block_bytes; l += 64)
        __builtin_prefetch(q + b * block_bytes + PREFETCH_AHEAD + l, 0, 3);
    if (bits == 5) __builtin_prefetch(high + 2 * B * ahead, 0, 3);
    if (bits == 6)
        for (int l = 0; l < 4 * B; l += 64) __builtin_prefetch(high + 4 * B * ahead + l, 0, 3);
    __builtin_prefetch(scales + ahead * GROUP * size, 0, 3);
}

/* Asks, at a tile's start, for the cache line of each of its R rows of results from column
 * `col` (one group's 16 floats), to be written. NOTE: the tile writes its results once, at
 * its end; the lines of a product of many rows (a 512-token prompt's q/k/v: 3 MiB) are rarely
 * in cache then, and each tile waited for its stores: on the Zen 5 AMD EPYC (one thread,
 * scripts/bench_block_kernels.py) the AVX-512 tiles took ~1.13x longer for q/k/v and gate/up
 * at 512 rows without this, and no row count was slower with it. The AVX2 tiles, twice as
 * long per result, gained nothing there from it and do without. */
static inline __attribute__((always_inline)) void prefetch_output(float* y, int64_t ldy, int R,
                                                                  int64_t col) {
    for (int m = 0; m < R; m++) __builtin_prefetch(y + m * ldy + col, 1, 3);
}

/* The activations of a product, quantised by block_gemv.c for every ISA alike, for the rows
 * of one tile (a "panel" of R rows, R = tile_rows(W, ...)), row m of the panel at a constant
 * offset, so that a tile needs one pointer per array:
 *   xw [K/2, R]: per unit u, each row's pair (a[2u], a[2u + 1]) of a = 256 q1 + q2 as int16
 *      (|a| <= 32639), read as one int32;
 *   dx [K/32, R]: the activation block's d / 256;
 *   zc [K/B, R]: -zero * A, A the exact sum of the weight block's a (the integer sum's start);
 *   xo [K/B, R]: float(A) * dx, the offsets' factor (NULL without offsets). */
typedef struct {
    const int32_t* xw;
    const float* dx;
    const int32_t* zc;
    const float* xo;
} Panel;

/* Each ISA's file defines these (block_dot_avx512.c, block_dot_avx2.c, block_dot_portable.c);
 * the others compile to nothing. */
#define INTERNAL __attribute__((visibility("hidden"))) /* not exported from the library */
/* the rows of the next tile of a product by W when `left` rows (>= 1) are still to do: as many
 * as the registers take. NOTE: from some `left` on, always the same height for W, a divisor of
 * ROW_CHUNK (block_gemv.c), so that a call's chunks of rows start at tiles' starts. */
INTERNAL int64_t tile_rows(const BlockMatrix* W, int64_t left);
/* groups a work item takes at once for a product of M rows */
INTERNAL int64_t tile_groups(int64_t M);
/* unpacked_bytes: bytes a work item of M rows against `groups` groups wants for the groups'
 * weights unpacked once for all its tiles (0: its tiles unpack the weights as they go, which
 * costs nothing more where an item holds one tile). unpack_groups: `groups` groups from g
 * unpacked into `to` (unpacked_bytes of them, 64-byte aligned). */
#if defined(INFERD_ISA_AVX2) || defined(INFERD_ISA_AVX512)
INTERNAL int64_t unpacked_bytes(const BlockMatrix* W, int64_t groups, int64_t M);
INTERNAL void unpack_groups(const BlockMatrix* W, int64_t g, int64_t groups, void* to);
#else /* the portable tile unpacks a block at a time for all its rows anyway */
static inline int64_t unpacked_bytes(const BlockMatrix* W, int64_t groups, int64_t M) {
    (void)W, (void)groups, (void)M;
    return 0;
}
static inline void unpack_groups(const BlockMatrix* W, int64_t g, int64_t groups, void* to) {
    (void)W, (void)g, (void)groups, (void)to;
}
#endif
/* y [R, ldy] columns 16 g .. 16 (g + groups) - 1 (those below W->N) = the R = tile_rows(W, ...)
 * rows of a panel against `groups` <= tile_groups(M) groups from g; `unpacked`: those groups
 * from unpack_groups, or NULL. NOTE: the same integer sums either way, so the same bits. */
INTERNAL void tile_product(const BlockMatrix* W, int64_t g, int64_t groups, Panel x, int64_t R,
                           float* y, int64_t ldy, const void* unpacked);

#endif

/* block_gemv.c's tile for AVX-512 (F, BW, VL), with or without VNNI (inferd).
 *
 * A 512-bit vector holds one unit of a group: 16 rows x 2 weights as int16, one int32 lane per
 * output row. Against a broadcast pair of 16-bit activations (block_layout.h), vpdpwssd (VNNI)
 * adds both products to each row's int32 sum in one instruction; without VNNI, vpmaddwd then
 * vpaddd. Neither can saturate or wrap: a pair is at most 2 * 128 * 32639 < 2^24, a block's sum
 * (from -zero * its activations' sum) stays within int32 (block_gemv.c). At the end of each
 * weight block the 16 sums become floats once, for the 16 rows at a time. */
#include "block_layout.h"

#ifdef INFERD_ISA_AVX512
#include <immintrin.h>

/* Loops over a tile's rows and groups are short and constant: unrolled, their accumulators
 * stay in registers (an array the compiler indexes at run time would live in memory). */
#ifdef INFERD_EMULATED_ISA
/* tests/emulated_isa.h: the intrinsics are SIMDe's C functions, for a test on a CPU without
 * this ISA. Unrolled and force-inlined, they took GCC minutes per file; the arithmetic is
 * the same either way. */
#define UNROLL
#define INLINE static inline
#else
#define UNROLL _Pragma("GCC unroll 16")
#define INLINE static inline __attribute__((always_inline))
#endif
#define MAX_ACC 24 /* rows x groups of a tile: one register each for their integer sums */

/* `bits` 0 in the functions below: the weights come from unpack_groups's buffer, one vector
 * per unit (the group's int16 q, its zero point not removed), rather than from W->q. */
#define UNPACKED 0

/* The codebook as vpermw's table: its 16 values as int16, twice. vpermw reads the low five
 * bits of each index: the copy makes bit 4 (a widened byte's high nibble's lowest) not matter,
 * so a low nibble needs no AND. */
INLINE __m512i codebook_table(const BlockMatrix* W) {
    return _mm512_broadcast_i64x4(
        _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)W->codebook)));
}

/* s with the two high bits of unit pair k (0-3) of h (a byte of 6-bit high bits widened to
 * each int16 lane, block_layout.h) at its bits 4-5: a shift, then s | (h' & 0x30) in one
 * ternary logic operation (0xF8: a | (b & c)). */
INLINE __m512i with_high2(__m512i s, __m512i h, const int k) {
    const int shift = HIGH2_SHIFT(k);
    const __m512i at = shift < 0   ? _mm512_slli_epi16(h, -shift)
                       : shift > 0 ? _mm512_srli_epi16(h, shift)
                                   : h;
    return _mm512_ternarylogic_epi32(s, at, _mm512_set1_epi16(0x30), 0xF8);
}

/* The two units (lo, hi) of chunk c of block b of a group: 8 bits, two loads sign-extended;
 * 4/5/6 bits, one load zero-extended, the nibbles split (and the high bits added); 4-bit
 * indexes, the nibbles looked up in `table` (codebook_table); UNPACKED, two loads from w. */
INLINE void unit_pair(const uint8_t* q, const uint8_t* high, const __m512i* w, int64_t b,
                      int64_t c, const int B, const int bits, __m512i table, __m512i* lo,
                      __m512i* hi) {
    const int64_t ulo = b * (B / 2) + c, uhi = ulo + B / 4;
    if (bits == UNPACKED) {
        *lo = _mm512_load_si512(w + ulo);
        *hi = _mm512_load_si512(w + uhi);
        return;
    }
    if (bits == 8) {
        *lo = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(q + 32 * ulo)));
        *hi = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(q + 32 * uhi)));
        return;
    }
    const __m512i v = _mm512_cvtepu8_epi16(
        _mm256_loadu_si256((const __m256i*)(q + 32 * (b * (B / 4) + c))));
    if (bits == CODED) {
        *lo = _mm512_permutexvar_epi16(v, table);
        *hi = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), table);
        return;
    }
    *lo = _mm512_and_si512(v, _mm512_set1_epi16(0x0F));
    *hi = _mm512_srli_epi16(v, 4);
    if (bits == 5) {
        uint32_t flo, fhi; /* bit 2r + i: the fifth bit of the unit's word 2r + i */
        memcpy(&flo, high + 4 * ulo, 4);
        memcpy(&fhi, high + 4 * uhi, 4);
        const __m512i sixteen = _mm512_set1_epi16(16);
        *lo = _mm512_mask_add_epi16(*lo, _cvtu32_mask32(flo), *lo, sixteen);
        *hi = _mm512_mask_add_epi16(*hi, _cvtu32_mask32(fhi), *hi, sixteen);
    }
    if (bits == 6) { /* chunks c and c ^ 1 share these 32 bytes: loaded once when unrolled */
        const __m512i h = _mm512_cvtepu8_epi16(
            _mm256_loadu_si256((const __m256i*)(high + 32 * (b * (B / 8) + c / 2))));
        *lo = with_high2(*lo, h, 2 * (int)(c % 2));
        *hi = with_high2(*hi, h, 2 * (int)(c % 2) + 1);
    }
}

/* sum + the two products of each row's int16 pair w and the activation pair `pair` */
INLINE __m512i pair_dot(__m512i sum, __m512i w, __m512i pair) {
#ifdef __AVX512VNNI__
    return _mm512_dpwssd_epi32(sum, w, pair);
#else
    return _mm512_add_epi32(sum, _mm512_madd_epi16(w, pair));
#endif
}

/* NOTE: an empty asm that "changes" a sum ends its chain of additions here: without it GCC
 * reassociates the exact integer additions of a whole unrolled weight block (vpmaddwd then
 * vpaddd, no VNNI) and keeps every product on the stack until it sums them (block_dot_avx2.c
 * measured what that costs). No instruction is emitted; the sums are the same integers. */
#ifdef INFERD_EMULATED_ISA /* an emulated vector may not fit a register */
INLINE void keep_in_register(__m512i* sum) { (void)sum; }
#else
INLINE void keep_in_register(__m512i* sum) { __asm__("" : "+v"(*sum)); }
#endif

/* The 16 rows' float scales of weight block b of a group (at, sup: group_scales and
 * group_supers of it): factored, super * sub (the scale: block_layout.h's scale_at). */
INLINE __m512 factored(const void* sub, const float* super, int64_t at, int64_t sup) {
    const __m128i s = _mm_loadu_si128((const __m128i*)((const int8_t*)sub + at));
    return _mm512_mul_ps(_mm512_loadu_ps(super + sup), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(s)));
}

/* fp16 tested first: the scales of most types (Q4_0, Q5_0, Q8_0) */
INLINE __m512 block_scales(const BlockMatrix* W, int64_t at, int64_t sup, int64_t b, const int B) {
    if (W->half_scales)
        return _mm512_cvtph_ps(
            _mm256_loadu_si256((const __m256i*)((const uint16_t*)W->scale + at + b * GROUP)));
    if (W->scale_super)
        return factored(W->scale, W->scale_super, at + b * GROUP, sup + b * B / 256 * GROUP);
    return _mm512_loadu_ps((const float*)W->scale + at + b * GROUP);
}

INLINE __m512 block_offsets(const BlockMatrix* W, int64_t at, int64_t sup, int64_t b,
                            const int B) {
    if (W->offset_super)
        return factored(W->offset, W->offset_super, at + b * GROUP, sup + b * B / 256 * GROUP);
    return _mm512_loadu_ps((const float*)W->offset + at + b * GROUP);
}

/* R panel rows against GR groups from g. The R x GR integer sums live in registers through a
 * weight block; the float sums in acc (kept in memory by the compiler where registers run
 * out: an update per block). Each activation pair is broadcast once for the GR groups.
 * SPLIT: two integer sums per row and group (lo and hi units), for few rows, whose sums would
 * otherwise wait on each other. UNPACKED: the groups' units from `unpacked`. */
INLINE void tile(const BlockMatrix* W, int64_t g, Panel x, float* y, int64_t ldy, const int bits,
                 const int B, const int R, const int GR, const int SPLIT,
                 const __m512i* unpacked) {
    const int64_t K = W->K, nb = K / B;
    const uint8_t *q[2], *high[2];
    const __m512i* w[2];
    const char* scales[2];
    int64_t at[2], sup[2];
    const int size = scale_bytes(W);
    UNROLL
    for (int j = 0; j < GR; j++) {
        q[j] = group_q(W, g + j);
        w[j] = bits == UNPACKED ? unpacked + j * (K / 2) : NULL;
        high[j] = bits == 5 || bits == 6 ? group_high(W, g + j) : NULL;
        at[j] = group_scales(W, g + j);
        sup[j] = W->scale_super || W->offset_super ? group_supers(W, g + j) : 0;
        scales[j] = (const char*)W->scale + at[j] * size;
    }
    const __m512i table = bits == CODED ? codebook_table(W) : _mm512_setzero_si512();
    UNROLL
    for (int j = 0; j < GR; j++) prefetch_output(y, ldy, R, (g + j) * GROUP);
    __m512 acc[MAX_ACC];
    UNROLL
    for (int i = 0; i < R * GR; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        UNROLL
        for (int j = 0; j < GR; j++)
            if (bits != UNPACKED) prefetch_block(q[j], high[j], scales[j], size, b, bits, B);
        __m512i s0[MAX_ACC], s1[MAX_ACC];
        UNROLL
        for (int m = 0; m < R; m++) {
            const __m512i start = _mm512_set1_epi32(x.zc[b * R + m]);
            UNROLL
            for (int j = 0; j < GR; j++) {
                s0[m * GR + j] = start;
                if (SPLIT) s1[m * GR + j] = _mm512_setzero_si512();
            }
        }
        const int32_t* a = x.xw + b * (B / 2) * R; /* the block's first unit, row 0 */
        UNROLL
        for (int c = 0; c < B / 4; c++) {
            __m512i lo[2], hi[2];
            UNROLL
            for (int j = 0; j < GR; j++)
                unit_pair(q[j], high[j], w[j], b, c, B, bits, table, &lo[j], &hi[j]);
            UNROLL
            for (int m = 0; m < R; m++) {
                const __m512i alo = _mm512_set1_epi32(a[c * R + m]);
                const __m512i ahi = _mm512_set1_epi32(a[(c + B / 4) * R + m]);
                UNROLL
                for (int j = 0; j < GR; j++) {
                    const int i = m * GR + j;
                    s0[i] = pair_dot(s0[i], lo[j], alo);
                    if (SPLIT)
                        s1[i] = pair_dot(s1[i], hi[j], ahi);
                    else
                        s0[i] = pair_dot(s0[i], hi[j], ahi);
                    keep_in_register(&s0[i]);
                    if (SPLIT) keep_in_register(&s1[i]);
                }
            }
        }
        __m512 scale[2];
        UNROLL
        for (int j = 0; j < GR; j++) scale[j] = block_scales(W, at[j], sup[j], b, B);
        UNROLL
        for (int m = 0; m < R; m++) {
            const __m512 d = _mm512_set1_ps(x.dx[b * B / XBLOCK * R + m]);
            UNROLL
            for (int j = 0; j < GR; j++) {
                const int i = m * GR + j;
                const __m512i sum = SPLIT ? _mm512_add_epi32(s0[i], s1[i]) : s0[i];
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(scale[j], d),
                                         acc[i]);
            }
        }
        if (W->offset) {
            UNROLL
            for (int j = 0; j < GR; j++) {
                const __m512 o = block_offsets(W, at[j], sup[j], b, B);
                UNROLL
                for (int m = 0; m < R; m++)
                    acc[m * GR + j] = _mm512_fmadd_ps(o, _mm512_set1_ps(x.xo[b * R + m]),
                                                      acc[m * GR + j]);
            }
        }
    }
    UNROLL
    for (int j = 0; j < GR; j++) {
        const int64_t n0 = (g + j) * GROUP, valid = W->N - n0 < GROUP ? W->N - n0 : GROUP;
        const __mmask16 keep = (__mmask16)((1u << valid) - 1);
        UNROLL
        for (int m = 0; m < R; m++) _mm512_mask_storeu_ps(y + m * ldy + n0, keep, acc[m * GR + j]);
    }
}

INLINE void product(const BlockMatrix* W, int64_t g, int64_t groups, Panel x, int64_t R,
                    float* y, int64_t ldy, const int bits, const int B, const __m512i* w) {
    if (groups == 2) {
        switch (R) { /* the heights tile_rows gives */
            case 1: tile(W, g, x, y, ldy, bits, B, 1, 2, 1, w); return;
            case 2: tile(W, g, x, y, ldy, bits, B, 2, 2, 1, w); return;
            case 3: tile(W, g, x, y, ldy, bits, B, 3, 2, 0, w); return;
            case 4: tile(W, g, x, y, ldy, bits, B, 4, 2, 0, w); return;
            case 6: tile(W, g, x, y, ldy, bits, B, 6, 2, 0, w); return;
            case 8: tile(W, g, x, y, ldy, bits, B, 8, 2, 0, w); return;
            default: tile(W, g, x, y, ldy, bits, B, 12, 2, 0, w); return;
        }
    }
    switch (R) { /* one group: calls of up to 4 rows, or the last of an odd count */
        case 1: tile(W, g, x, y, ldy, bits, B, 1, 1, 1, w); break;
        case 2: tile(W, g, x, y, ldy, bits, B, 2, 1, 1, w); break;
        case 3: tile(W, g, x, y, ldy, bits, B, 3, 1, 1, w); break;
        case 4: tile(W, g, x, y, ldy, bits, B, 4, 1, 1, w); break;
        case 6: tile(W, g, x, y, ldy, bits, B, 6, 1, 0, w); break;
        case 8: tile(W, g, x, y, ldy, bits, B, 8, 1, 0, w); break;
        default: tile(W, g, x, y, ldy, bits, B, 12, 1, 0, w); break;
    }
}

/* 12 rows of integer sums for two groups in registers, their float sums in memory; or, for the
 * formats with offsets (Q4_K, Q5_K: one more FMA per row, group and block), 6 rows with both
 * kinds of sums in registers: the float sums' round trip through memory at every block end cost
 * those more than the 12 rows' fewer weight unpackings save (one thread on the Zen 5 AMD EPYC,
 * scripts/bench_block_kernels.py: Q4_K products 1.05-1.08x faster from 16 rows on, the other
 * formats no faster). With 8 rows or fewer left, the same heights for every format (a call of
 * 8 rows is one 8-row tile of one group at a time, its sums all in registers), in tiles that keep
 * the instantiations few. */
int64_t tile_rows(const BlockMatrix* W, int64_t left) {
    static const int64_t twelve[] = {12, 8, 6, 4, 3, 2, 1}, six[] = {6, 4, 3, 2, 1};
    const int64_t* heights = W->offset && left > 8 ? six : twelve;
    for (int i = 0;; i++)
        if (heights[i] <= left) return heights[i];
}

/* Two groups per tile share each activation broadcast; but a step of a few rows is bound by
 * reading the weights from memory, which one stream at a time keeps fastest (on an AMD EPYC
 * with AVX-512, one thread: the LM head at 8 rows took half the time with one group). */
int64_t tile_groups(int64_t M) { return M <= 8 ? 1 : 2; }

INLINE void product_of(int b16, const BlockMatrix* W, int64_t g, int64_t groups, Panel x,
                       int64_t R, float* y, int64_t ldy, const int bits, const __m512i* w) {
    if (b16)
        product(W, g, groups, x, R, y, ldy, bits, 16, w);
    else
        product(W, g, groups, x, R, y, ldy, bits, 32, w);
}

/* One function per format, each holding its 28 tiles (bits and B are constants in each: their
 * loops unroll). NOTE: not inlined into one: with the tiles of every format in one function
 * (168 of them), GCC's register allocation put a register move beside each vpdpwssd of the
 * 12-row tiles (~1,050 instructions per block of 384 vpdpwssd, against ~640), and the 8-bit
 * products of 64 to 512 rows ran ~1.1x slower (one thread, 2-core Intel Xeon). */
#define PRODUCT_FOR(name, bits)                                                                \
    static __attribute__((noinline)) void name(const BlockMatrix* W, int64_t g, int64_t groups, \
                                               Panel x, int64_t R, float* y, int64_t ldy,     \
                                               const __m512i* w) {                             \
        product_of(W->B == 16, W, g, groups, x, R, y, ldy, bits, w);                           \
    }
PRODUCT_FOR(product_4, 4)
PRODUCT_FOR(product_5, 5)
PRODUCT_FOR(product_6, 6)
PRODUCT_FOR(product_8, 8)
PRODUCT_FOR(product_coded, CODED)
PRODUCT_FOR(product_unpacked, UNPACKED)

void tile_product(const BlockMatrix* W, int64_t g, int64_t groups, Panel x, int64_t R, float* y,
                  int64_t ldy, const void* unpacked) {
    if (unpacked) { /* the weights' format no longer matters */
        product_unpacked(W, g, groups, x, R, y, ldy, (const __m512i*)unpacked);
        return;
    }
    switch (q_format(W)) {
        case 4: product_4(W, g, groups, x, R, y, ldy, NULL); break;
        case 5: product_5(W, g, groups, x, R, y, ldy, NULL); break;
        case 6: product_6(W, g, groups, x, R, y, ldy, NULL); break;
        case CODED: product_coded(W, g, groups, x, R, y, ldy, NULL); break;
        default: product_8(W, g, groups, x, R, y, ldy, NULL);
    }
}

/* From this many rows a work item unpacks its groups once for all its tiles, which then only
 * load the weights: the 512-bit shifts that split nibbles and place high bits share port 0
 * with vpdpwssd on Intel's cores. Against unpacking as the tiles go (one thread, a shared
 * 2-core Intel Xeon, the embedded model's matrices): 5- and 6-bit products of 64 to 512 rows
 * 1.1-1.2x faster, 4-bit ones (Q4_K: 6-row tiles) 1.0-1.03x, and those of 16 rows 1.04-1.13x
 * slower (two tiles share the unpacking there), of 32 rows about as fast. Never for 8 bits,
 * whose unpacking is the load's sign extension (block_dot_avx2.c measured the cost of reading
 * twice the bytes back). */
#define UNPACK_FROM_ROWS 32

int64_t unpacked_bytes(const BlockMatrix* W, int64_t groups, int64_t M) {
    if (M < UNPACK_FROM_ROWS || W->bits == 8) return 0;
    return groups * (W->K / 2) * (int64_t)sizeof(__m512i);
}

/* One group's units as the tiles read them: unit u at to[u]. */
static void unpack_group(const BlockMatrix* W, int64_t g, __m512i* to, const int bits,
                         const int B) {
    const uint8_t *q = group_q(W, g), *high = bits == 5 || bits == 6 ? group_high(W, g) : NULL;
    const __m512i table = bits == CODED ? codebook_table(W) : _mm512_setzero_si512();
    for (int64_t b = 0; b < W->K / B; b++) {
        UNROLL
        for (int c = 0; c < B / 4; c++) {
            __m512i lo, hi;
            unit_pair(q, high, NULL, b, c, B, bits, table, &lo, &hi);
            _mm512_store_si512(to + b * (B / 2) + c, lo);
            _mm512_store_si512(to + b * (B / 2) + c + B / 4, hi);
        }
    }
}

INLINE void unpack_group_of(int b16, const BlockMatrix* W, int64_t g, __m512i* to,
                            const int bits) {
    if (b16)
        unpack_group(W, g, to, bits, 16);
    else
        unpack_group(W, g, to, bits, 32);
}

void unpack_groups(const BlockMatrix* W, int64_t g, int64_t groups, void* to) {
    for (int64_t j = 0; j < groups; j++) {
        __m512i* w = (__m512i*)to + j * (W->K / 2);
        switch (q_format(W)) {
            case 4: unpack_group_of(W->B == 16, W, g + j, w, 4); break;
            case 5: unpack_group_of(W->B == 16, W, g + j, w, 5); break;
            case 6: unpack_group_of(W->B == 16, W, g + j, w, 6); break;
            case CODED: unpack_group_of(W->B == 16, W, g + j, w, CODED); break;
            default: unpack_group_of(W->B == 16, W, g + j, w, 8); /* unpacked_bytes: never */
        }
    }
}
#endif

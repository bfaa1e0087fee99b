/* Products with FP8 (e4m3fn) weights kept as stored, one byte each, with a float32 scale per
 * output row: the linear weights of HF checkpoints in the compressed-tensors format (inferd).
 * inferd/layers/fp8_weight.py packs the layout and calls this through ctypes; build.py compiles
 * it into every ISA variant's library with the other kernels.
 *
 * Layout: output rows in groups of 16 (the last padded with code 0), and per group, for each
 * input k, the 16 rows' codes side by side: codes[g, k, r] = the code of row 16 g + r at input
 * k, [ceil(N/16), K, 16] bytes. One k of a group converts to one vector of 16 floats (one zmm,
 * two ymm), which multiplies a broadcast activation: vector lanes are output rows, so no output
 * needs a sum across lanes.
 *
 * Conversion (fp8_convert.h): each code becomes w' = w / 256 exactly (its fp16 form), the 256
 * folded into the row's scale once, by fp8_weight.py: s' = scale * 256 (float32). A row holding
 * a NaN code (0x7F, 0xFF) gets s' = NaN, which makes all its outputs NaN, as its NaN weight
 * would (the conversion itself makes those codes finite).
 *
 * NOTE: the numeric definition. Per output (m, n), in IEEE float32, fma fused (as fmaf):
 *     acc = +0;  for k = 0, 1, ..., K - 1 in that order:  acc = fma(x[m, k], w'[n, k], acc);
 *     y[m, n] = acc * s'[n]
 * Every ISA variant performs exactly that (the portable C with fmaf): one accumulator per
 * output, so neither the vector width nor which tile or thread computes an output nor which
 * other rows share the call changes a bit of it (tests/unit/test_fp8_weight.py checks both). A
 * sum stored into y between two ranges of k and loaded back is the same float, so blocking over
 * k changes nothing either. The work in flight comes from many outputs at once (16 per group,
 * several groups, several rows), never from splitting an output's k.
 *
 * Two ways through, with the same arithmetic: a few rows (decode) keep each tile's sums in
 * registers over all of K, converting the codes as they stream in (each conversion serving the
 * tile's rows); many rows (prefill) convert a panel of KC inputs of a group once into floats
 * and run every row of a chunk against it, a GEMM's register tile (6 rows x 16 outputs in
 * AVX2: 12 accumulators), the sums kept in y between panels. */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "fp8_convert.h"
#include "kernels.h"

/* Tile shapes: what keeps a tile's sums in registers (AVX2 has 16 ymm, AVX-512 32 zmm). A
 * direct tile (few rows) of R rows takes as many whole groups as REG_BUDGET registers allow
 * (GROUPS_PER_TILE; up to DIRECT_GROUPS: one row has 8 (AVX2) or 4 (AVX-512) independent chains
 * of FMAs in flight); where not even one group fits, one register's slice of a group (8 outputs
 * in AVX2). NOTE: on Zen 3 vcvtph2ps is what a few rows wait for (a fake conversion ran the
 * one-row product 2.5x faster), so each conversion serves as many rows as registers allow:
 * rows 5 to 8 in tiles of 5 to 8 rows rather than 4 + the rest took 8 rows from ~44 to ~56
 * GFLOP/s (64 x 4096 in L2, one thread, AMD EPYC Zen 3). */
#define DIRECT_GROUPS 4 /* groups per work item of the direct way: 4, 2 or 1 per tile */
#define DIRECT_ROWS 8
#if defined(__AVX512F__)
#define REG_BUDGET 31
#define MAX_ACC 32
#define PANEL_ROWS 8
#define PANEL_GROUPS 2
#elif defined(F16C_CONVERSION)
#define REG_BUDGET 15
#define MAX_ACC 12
#define PANEL_ROWS 6
#define PANEL_GROUPS 1
#else /* plain floats: any shape */
#define REG_BUDGET (1 << 12)
#define MAX_ACC (DIRECT_ROWS * DIRECT_GROUPS * PER_GROUP)
#define PANEL_ROWS 4
#define PANEL_GROUPS 1
#endif
/* Rows of a call from which it takes the panel way. NOTE: 8 rows as a panel's tiles of 6 + 2 took
 * ~1.3x as long as the direct tile of 8 rows; 12 and 15 rows ran alike either way (Zen 3). */
#define PANEL_FROM 16
#define KC 256 /* inputs per panel: 16 KB of floats per group, in L1 */
#define CHUNK_ROWS (16 * PANEL_ROWS) /* rows per work item: their KC inputs stay in L2 */
/* Bytes ahead of a group's codes the direct tiles ask for. NOTE: as block_layout.h's
 * PREFETCH_AHEAD, which the block products needed on an Intel Xeon; on Zen 3 (one thread, 1536 x
 * 8960 read from memory) no difference was measured either way. */
#define PREFETCH_AHEAD 1024

/* Outputs of group g in a row: 16, fewer in the last group. */
ALWAYS_INLINE int64_t valid_of(const Fp8Matrix* W, int64_t g) {
    const int64_t left = W->N - g * LANES;
    return left < LANES ? left : LANES;
}

/* acc (R rows x GG groups, PER_GROUP registers each) times s', stored to y. */
ALWAYS_INLINE void finish(const Fp8Matrix* W, int64_t g, reg* acc, float* y, int64_t ldy,
                          const int R, const int GG) {
    UNROLL
    for (int gg = 0; gg < GG; gg++) {
        reg s[PER_GROUP];
        UNROLL
        for (int j = 0; j < PER_GROUP; j++) s[j] = rload(W->scale + (g + gg) * LANES + j * REG);
        UNROLL
        for (int m = 0; m < R; m++) {
            reg* a = acc + (m * GG + gg) * PER_GROUP;
            UNROLL
            for (int j = 0; j < PER_GROUP; j++) a[j] = rmul(a[j], s[j]);
            store_group(y + m * ldy + (g + gg) * LANES, a, valid_of(W, g + gg));
        }
    }
}

/* Registers a direct tile of R rows by NW registers of weights holds: its sums, and the rows'
 * activations and the weights of one input (direct_tile's two loop orders); and the whole
 * groups a tile of R rows takes (0: not even one, a register's slice at a time). Macros: the
 * shape must be a constant in each instantiation. */
#define TILE_REGISTERS(R, NW) ((R) * (NW) + ((NW) <= 2 ? 1 + (NW) : (R) + 1))
#define FITS(R, GG) (TILE_REGISTERS(R, (GG) * PER_GROUP) <= REG_BUDGET)
#define GROUPS_PER_TILE(R) (FITS(R, 4) ? 4 : FITS(R, 2) ? 2 : FITS(R, 1) ? 1 : 0)

/* R rows of x (row stride K) against registers J0 .. J0 + NJ - 1 of groups g .. g + GG - 1,
 * over all of K, the sums in registers: each conversion of codes serves the R rows. */
ALWAYS_INLINE void direct_tile(const Fp8Matrix* W, const float* x, int64_t g, float* y,
                               int64_t ldy, const int R, const int GG, const int J0,
                               const int NJ) {
    const int64_t K = W->K;
    const uint8_t* codes = W->codes + g * K * LANES;
    reg acc[MAX_ACC];
    UNROLL
    for (int i = 0; i < R * GG * NJ; i++) acc[i] = rzero();
    for (int64_t k4 = 0; k4 < K; k4 += 4) { /* K is a multiple of 32 */
        UNROLL
        for (int gg = 0; gg < GG; gg++) /* a cache line of each group's codes per 4 inputs */
            __builtin_prefetch(codes + (gg * K + k4) * LANES + PREFETCH_AHEAD, 0, 3);
        UNROLL_K
        for (int64_t k = k4; k < k4 + 4; k++) {
            if (GG * NJ <= 2) { /* the weights first, then a row at a time: one activation */
                reg w[2];
                UNROLL
                for (int i = 0; i < GG * NJ; i++)
                    w[i] = convert_slice(codes + (i / NJ * K + k) * LANES, J0 + i % NJ);
                UNROLL
                for (int m = 0; m < R; m++) {
                    const reg xb = rsplat(x[m * K + k]);
                    UNROLL
                    for (int i = 0; i < GG * NJ; i++)
                        acc[m * GG * NJ + i] = rfma(xb, w[i], acc[m * GG * NJ + i]);
                }
            } else { /* the activations first, then a register of weights at a time */
                reg xb[DIRECT_ROWS];
                UNROLL
                for (int m = 0; m < R; m++) xb[m] = rsplat(x[m * K + k]);
                UNROLL
                for (int i = 0; i < GG * NJ; i++) {
                    const reg w = convert_slice(codes + (i / NJ * K + k) * LANES, J0 + i % NJ);
                    UNROLL
                    for (int m = 0; m < R; m++)
                        acc[m * GG * NJ + i] = rfma(xb[m], w, acc[m * GG * NJ + i]);
                }
            }
        }
    }
    UNROLL
    for (int i = 0; i < GG * NJ; i++) {
        const int64_t n0 = (g + i / NJ) * LANES, col = (J0 + i % NJ) * REG;
        const int64_t left = valid_of(W, g + i / NJ) - col;
        if (left <= 0) continue; /* padding rows only */
        const reg s = rload(W->scale + n0 + col);
        UNROLL
        for (int m = 0; m < R; m++) {
            const reg v = rmul(acc[m * GG * NJ + i], s);
            if (left >= REG) rstore(y + m * ldy + n0 + col, v);
            else rstore_n(y + m * ldy + n0 + col, v, left);
        }
    }
}

/* R rows against `groups` groups from g, `per` whole groups per tile (GROUPS_PER_TILE(R)). */
ALWAYS_INLINE void direct_shape(const Fp8Matrix* W, const float* x, int64_t g, int64_t groups,
                                float* y, int64_t ldy, const int R, const int per) {
    for (int64_t j = 0; j < groups;) {
        if (per == 0) {
            UNROLL
            for (int J = 0; J < PER_GROUP; J++) direct_tile(W, x, g + j, y, ldy, R, 1, J, 1);
            j += 1;
        } else if (groups - j >= per) {
            direct_tile(W, x, g + j, y, ldy, R, per, 0, PER_GROUP);
            j += per;
        } else {
            direct_tile(W, x, g + j, y, ldy, R, 1, 0, PER_GROUP);
            j += 1;
        }
    }
}

#define DIRECT_CASE(r) \
    case r: direct_shape(W, x, g, groups, y, ldy, r, GROUPS_PER_TILE(r)); break;

static void direct_rows(const Fp8Matrix* W, const float* x, int64_t g, int64_t groups,
                        float* y, int64_t ldy, int64_t R) {
    switch (R) {
        DIRECT_CASE(1)
        DIRECT_CASE(2)
        DIRECT_CASE(3)
        DIRECT_CASE(4)
        DIRECT_CASE(5)
        DIRECT_CASE(6)
        DIRECT_CASE(7)
        DIRECT_CASE(8)
        default: break;
    }
}

/* Rows m0 .. m1 - 1 against groups g0 .. g1 - 1, the direct way. */
static void direct(const Fp8Matrix* W, const float* x, int64_t m0, int64_t m1, int64_t g0,
                   int64_t g1, float* y, int64_t ldy) {
    for (int64_t m = m0; m < m1;) {
        const int64_t R = m1 - m < DIRECT_ROWS ? m1 - m : DIRECT_ROWS;
        direct_rows(W, x + m * W->K, g0, g1 - g0, y + m * ldy, ldy, R);
        m += R;
    }
}

/* panel [GG][KC][16] = w' of groups g .. g + GG - 1 at inputs k0 .. k0 + kc - 1 */
static void convert_panel(const Fp8Matrix* W, int64_t g, int64_t GG, int64_t k0, int64_t kc,
                          float* panel) {
    for (int64_t gg = 0; gg < GG; gg++) {
        const uint8_t* c = W->codes + ((g + gg) * W->K + k0) * LANES;
        float* p = panel + gg * KC * LANES;
        for (int64_t k = 0; k < kc; k++) {
            reg w[PER_GROUP];
            convert16(c + k * LANES, w);
            UNROLL
            for (int j = 0; j < PER_GROUP; j++) rstore(p + k * LANES + j * REG, w[j]);
        }
    }
}

/* R rows of x (row stride K, from input k0) against the panel's GG groups from g, for its kc
 * inputs: the sums start at 0 (`first`) or from y, and end in y, times s' when `last`. */
ALWAYS_INLINE void panel_tile(const Fp8Matrix* W, const float* panel, const float* x, int64_t g,
                              int64_t k0, int64_t kc, float* y, int64_t ldy, int first, int last,
                              const int R, const int GG) {
    const int64_t K = W->K;
    reg acc[PANEL_ROWS * PANEL_GROUPS * PER_GROUP];
    UNROLL
    for (int m = 0; m < R; m++) {
        UNROLL
        for (int gg = 0; gg < GG; gg++) {
            reg* a = acc + (m * GG + gg) * PER_GROUP;
            if (first) {
                UNROLL
                for (int j = 0; j < PER_GROUP; j++) a[j] = rzero();
            } else {
                load_group(y + m * ldy + (g + gg) * LANES, a, valid_of(W, g + gg));
            }
        }
    }
    const float* xk = x + k0;
    UNROLL_K
    for (int64_t k = 0; k < kc; k++) {
        reg w[PANEL_GROUPS * PER_GROUP];
        UNROLL
        for (int gg = 0; gg < GG; gg++) {
            UNROLL
            for (int j = 0; j < PER_GROUP; j++)
                w[gg * PER_GROUP + j] = rload(panel + (gg * KC + k) * LANES + j * REG);
        }
        UNROLL
        for (int m = 0; m < R; m++) {
            const reg xb = rsplat(xk[m * K + k]);
            UNROLL
            for (int gg = 0; gg < GG; gg++) {
                reg* a = acc + (m * GG + gg) * PER_GROUP;
                UNROLL
                for (int j = 0; j < PER_GROUP; j++) a[j] = rfma(xb, w[gg * PER_GROUP + j], a[j]);
            }
        }
    }
    if (last) {
        finish(W, g, acc, y, ldy, R, GG);
        return;
    }
    UNROLL
    for (int m = 0; m < R; m++) {
        UNROLL
        for (int gg = 0; gg < GG; gg++)
            store_group(y + m * ldy + (g + gg) * LANES, acc + (m * GG + gg) * PER_GROUP,
                        valid_of(W, g + gg));
    }
}

#define PANEL_CASE(r)                                                                   \
    case r:                                                                             \
        if (GG == PANEL_GROUPS)                                                         \
            panel_tile(W, panel, x, g, k0, kc, y, ldy, first, last, r, PANEL_GROUPS);   \
        else                                                                            \
            panel_tile(W, panel, x, g, k0, kc, y, ldy, first, last, r, 1);              \
        break;

/* A tile of R <= PANEL_ROWS rows: the shapes are constants in each instantiation. */
static void panel_rows(const Fp8Matrix* W, const float* panel, const float* x, int64_t g,
                       int64_t GG, int64_t k0, int64_t kc, float* y, int64_t ldy, int first,
                       int last, int64_t R) {
    switch (R) {
        PANEL_CASE(1)
        PANEL_CASE(2)
        PANEL_CASE(3)
        PANEL_CASE(4)
#if PANEL_ROWS >= 6
        PANEL_CASE(5)
        PANEL_CASE(6)
#endif
#if PANEL_ROWS >= 8
        PANEL_CASE(7)
        PANEL_CASE(8)
#endif
        default: break;
    }
}

/* Rows m0 .. m1 - 1 against groups g0 .. g1 - 1, panel by panel. */
static void panels(const Fp8Matrix* W, const float* x, int64_t m0, int64_t m1, int64_t g0,
                   int64_t g1, float* y, int64_t ldy, float* panel) {
    const int64_t K = W->K;
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kc = K - k0 < KC ? K - k0 : KC;
        const int first = k0 == 0, last = k0 + kc == K;
        for (int64_t g = g0; g < g1; g += PANEL_GROUPS) {
            const int64_t GG = g1 - g < PANEL_GROUPS ? g1 - g : PANEL_GROUPS;
            convert_panel(W, g, GG, k0, kc, panel);
            for (int64_t m = m0; m < m1;) {
                const int64_t R = m1 - m < PANEL_ROWS ? m1 - m : PANEL_ROWS;
                panel_rows(W, panel, x + m * K, g, GG, k0, kc, y + m * ldy, ldy, first, last, R);
                m += R;
            }
        }
    }
}

/* y [M, ldy] (columns 0 .. N-1) = x [M, K] . w^T, w the FP8 weights with their row scales.
 * Returns 0, or -1 if the shapes are not supported (K a positive multiple of 32, N >= 1,
 * M >= 1, ldy >= N). */
int inferd_fp8_gemm(const float* x, int64_t M, const Fp8Matrix* W, float* y, int64_t ldy) {
    const int64_t N = W->N, K = W->K;
    if (K <= 0 || K % 32 || N < 1 || M < 1 || ldy < N) return -1;
    const int64_t G = (N + LANES - 1) / LANES;
    const int parallel = (double)M * (double)N * (double)K >= (double)(1 << 18);
    if (M < PANEL_FROM) {
        /* NOTE: a thread takes whole direct tiles of groups (the one-row tile's 4): which
         * thread or tile computes an output changes nothing in it */
        const int64_t items = (G + DIRECT_GROUPS - 1) / DIRECT_GROUPS;
#pragma omp parallel for schedule(static) if (parallel)
        for (int64_t i = 0; i < items; i++) {
            const int64_t g0 = i * DIRECT_GROUPS;
            direct(W, x, 0, M, g0, g0 + DIRECT_GROUPS < G ? g0 + DIRECT_GROUPS : G, y, ldy);
        }
        return 0;
    }
    /* Work items: a block of groups (each thread's share of them, so that x is read from
     * memory about once per thread) times a chunk of rows (so that fewer groups than threads
     * still share out, and a chunk's KC inputs stay in L2 while its groups pass). */
    const int64_t threads = parallel ? omp_get_max_threads() : 1;
    int64_t per_block = (G + threads - 1) / threads;
    per_block = (per_block + PANEL_GROUPS - 1) / PANEL_GROUPS * PANEL_GROUPS;
    const int64_t blocks = (G + per_block - 1) / per_block;
    const int64_t chunks = (M + CHUNK_ROWS - 1) / CHUNK_ROWS;
#pragma omp parallel if (parallel)
    {
        float* panel = aligned_alloc(64, sizeof(float) * PANEL_GROUPS * KC * LANES);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < blocks * chunks; i++) {
            const int64_t g0 = i / chunks * per_block, m0 = i % chunks * CHUNK_ROWS;
            const int64_t g1 = g0 + per_block < G ? g0 + per_block : G;
            const int64_t m1 = m0 + CHUNK_ROWS < M ? m0 + CHUNK_ROWS : M;
            if (panel) panels(W, x, m0, m1, g0, g1, y, ldy, panel);
            else direct(W, x, m0, m1, g0, g1, y, ldy); /* no memory for a panel: same bits */
        }
        free(panel);
    }
    return 0;
}

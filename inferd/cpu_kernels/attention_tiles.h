/* The two products of attention over one chunk of keys, shaped like a GEMM (inferd,
 * decode_attention.c): several query vectors against several keys, each operand loaded once for
 * all the products it takes part in, the sums in registers.
 *
 * Scores: query vector q against key k, D values: 16 lanes, lane l the chain
 * acc = fma(q[d], k[d], acc) over d = l, l + 16, ... in ascending order, then `tree` over the
 * lanes (fixed_order.h). A block is 4 query vectors x 4 keys: 16 such chains side by side, one
 * butterfly for all 16 at the end (`tree16`).
 *
 * Weighted values: output o of one query vector, o[d] = the chain acc = fma(w[t], v_t[d], acc)
 * over its keys t in ascending order, lanes over d. A block is PV_Q query vectors x PV_D values
 * of d, each value row v_t loaded once for the block's query vectors.
 *
 * NOTE: every chain above is one output's, in an order fixed by D and by the keys the output
 * sees: which block, pass or thread computes it, and what else the block holds, changes no
 * operation. A key outside a vector's range is never part of its chain. */
#ifndef INFERD_ATTENTION_TILES_H
#define INFERD_ATTENTION_TILES_H
#include "fixed_order.h"

#if defined(__AVX512F__)
#define QK_SUB_Q 4 /* the query vectors x keys of a block kept in registers at once */
#define QK_SUB_K 4
#define PV_Q 4 /* query vectors of a weighted-values block */
#define PV_R 4 /* registers of d per block */
#elif REG > 1  /* 16 ymm registers: smaller register blocks of the same chains */
#define QK_SUB_Q 2
#define QK_SUB_K 2
#define PV_Q 4
#define PV_R 2
#else
#define QK_SUB_Q 1
#define QK_SUB_K 1
#define PV_Q 4
#define PV_R 16
#endif
#define PV_D (PV_R * REG) /* values of d per block */

/* the `n` (0 <= n <= REG) floats at p as a register */
ALWAYS_INLINE reg rload_upto(const float* p, int64_t n) {
    return n == REG ? rload(p) : n > 0 ? rload_n(p, n) : rzero();
}

/* One register block of the 4 x 4 scores: query vectors q[i0 ..], keys k[k0 ..]. */
ALWAYS_INLINE void qk_sub(const float* const q[4], const float* const k[4], int64_t D, int i0,
                          int k0, reg acc[16][PER_GROUP]) {
    reg s[QK_SUB_Q][QK_SUB_K][PER_GROUP];
    for (int i = 0; i < QK_SUB_Q; i++)
        for (int j = 0; j < QK_SUB_K; j++)
            for (int h = 0; h < PER_GROUP; h++) s[i][j][h] = rzero();
    int64_t d = 0;
    for (; d + LANES <= D; d += LANES)
        for (int h = 0; h < PER_GROUP; h++) {
            reg kv[QK_SUB_K];
            for (int j = 0; j < QK_SUB_K; j++) kv[j] = rload(k[k0 + j] + d + h * REG);
            for (int i = 0; i < QK_SUB_Q; i++) {
                const reg qv = rload(q[i0 + i] + d + h * REG);
                for (int j = 0; j < QK_SUB_K; j++) s[i][j][h] = rfma(qv, kv[j], s[i][j][h]);
            }
        }
    /* the last D % 16: lanes past D are 0, and fma(0, 0, acc) leaves acc as it is (never -0) */
    for (int h = 0; d < D && h < PER_GROUP; h++) {
        const int64_t left = D - d - h * REG, n = left > REG ? REG : left > 0 ? left : 0;
        reg kv[QK_SUB_K];
        for (int j = 0; j < QK_SUB_K; j++) kv[j] = rload_upto(k[k0 + j] + d + h * REG, n);
        for (int i = 0; i < QK_SUB_Q; i++) {
            const reg qv = rload_upto(q[i0 + i] + d + h * REG, n);
            for (int j = 0; j < QK_SUB_K; j++) s[i][j][h] = rfma(qv, kv[j], s[i][j][h]);
        }
    }
    for (int i = 0; i < QK_SUB_Q; i++)
        for (int j = 0; j < QK_SUB_K; j++)
            for (int h = 0; h < PER_GROUP; h++) acc[(i0 + i) * 4 + k0 + j][h] = s[i][j][h];
}

/* out[4 i + j] = the score of query vector q[i] against key k[j], i, j < 4. */
static void qk_block(const float* const q[4], const float* const k[4], int64_t D,
                     float out[16]) {
    reg acc[16][PER_GROUP];
    for (int i0 = 0; i0 < 4; i0 += QK_SUB_Q)
        for (int k0 = 0; k0 < 4; k0 += QK_SUB_K) qk_sub(q, k, D, i0, k0, acc);
    tree16(acc, out);
}

/* o[i][d0 .. d0 + len) (i < nq <= PV_Q; len <= PV_D, `full`: len is PV_D) continued by the
 * keys t = a .. b - 1: o[i][d] = fma(w[i][t], v[t][d], o[i][d]). */
ALWAYS_INLINE void pv_block(const float* const w[PV_Q], int nq, const float* const* v,
                            int64_t a, int64_t b, int64_t d0, int64_t len, float* const o[PV_Q],
                            const int full) {
    int64_t n[PV_R]; /* the floats of each register: REG, but at the end of a short block */
    for (int j = 0; j < PV_R; j++) {
        const int64_t left = len - j * REG;
        n[j] = full ? REG : left > REG ? REG : left > 0 ? left : 0;
    }
    reg acc[PV_Q][PV_R];
    for (int i = 0; i < PV_Q; i++)
        for (int j = 0; j < PV_R; j++)
            acc[i][j] = i < nq ? rload_upto(o[i] + d0 + j * REG, n[j]) : rzero();
    for (int64_t t = a; t < b; t++) {
        reg x[PV_R];
        for (int j = 0; j < PV_R; j++) x[j] = rload_upto(v[t] + d0 + j * REG, n[j]);
        for (int i = 0; i < PV_Q; i++) {
            if (i >= nq) continue;
            const reg p = rsplat(w[i][t]);
            for (int j = 0; j < PV_R; j++)
                if (n[j] > 0) acc[i][j] = rfma(p, x[j], acc[i][j]);
        }
    }
    for (int i = 0; i < PV_Q; i++)
        for (int j = 0; j < PV_R; j++)
            if (i < nq && n[j] > 0) {
                if (n[j] == REG)
                    rstore(o[i] + d0 + j * REG, acc[i][j]);
                else
                    rstore_n(o[i] + d0 + j * REG, acc[i][j], n[j]);
            }
}

/* The same for all of d (D values) at once. */
static void pv_rows(const float* const w[PV_Q], int nq, const float* const* v, int64_t a,
                    int64_t b, int64_t D, float* const o[PV_Q]) {
    if (a >= b) return;
    int64_t d0 = 0;
    if (nq == PV_Q)
        for (; d0 + PV_D <= D; d0 += PV_D) pv_block(w, PV_Q, v, a, b, d0, PV_D, o, 1);
    for (; d0 < D; d0 += PV_D) {
        const int64_t len = D - d0 < PV_D ? D - d0 : PV_D;
        pv_block(w, nq, v, a, b, d0, len, o, 0);
    }
}
/* Query vectors j G .. j G + G - 1 (row j's heads; weights w at stride ws, outputs o at stride
 * os) continued by the keys a .. b - 1, PV_Q heads a block. */
static void pv_row(int64_t j, int64_t G, const float* w, int64_t ws, const float* const* v,
                   int64_t a, int64_t b, int64_t D, float* o, int64_t os) {
    for (int64_t g0 = 0; g0 < G && a < b; g0 += PV_Q) {
        const int n = G - g0 < PV_Q ? (int)(G - g0) : PV_Q;
        const float* wq[PV_Q];
        float* oq[PV_Q];
        for (int i = 0; i < n; i++) {
            wq[i] = w + (j * G + g0 + i) * ws;
            oq[i] = o + (j * G + g0 + i) * os;
        }
        pv_rows(wq, n, v, a, b, D, oq);
    }
}

/* The weighted values of a tile's rows over one chunk: row j's G query vectors over its keys
 * lo[j] .. hi[j] - 1 (none if lo[j] >= hi[j]), outputs starting from what o holds. With fewer
 * heads than PV_Q, several rows share a block over the keys all of them see; each row takes its
 * other keys on its own, before and after, so its chains stay in ascending key order. */
static void weigh_values(int64_t rows, int64_t G, const int64_t* lo, const int64_t* hi,
                         const float* w, int64_t ws, const float* const* v, int64_t D, float* o,
                         int64_t os) {
    const int64_t together = G >= PV_Q ? 1 : PV_Q / G;
    for (int64_t j0 = 0; j0 < rows; j0 += together) {
        const int64_t j1 = j0 + together < rows ? j0 + together : rows;
        int64_t A = 0, B = INT64_MAX, seen = 0;
        for (int64_t j = j0; j < j1; j++)
            if (lo[j] < hi[j]) A = lo[j] > A ? lo[j] : A, B = hi[j] < B ? hi[j] : B, seen++;
        if (seen < 2 || A >= B) { /* no keys shared */
            for (int64_t j = j0; j < j1; j++) pv_row(j, G, w, ws, v, lo[j], hi[j], D, o, os);
            continue;
        }
        const float* wq[PV_Q];
        float* oq[PV_Q];
        int n = 0;
        for (int64_t j = j0; j < j1; j++) {
            if (lo[j] >= hi[j]) continue;
            pv_row(j, G, w, ws, v, lo[j], A, D, o, os);
            for (int64_t g = 0; g < G; g++, n++) {
                wq[n] = w + (j * G + g) * ws;
                oq[n] = o + (j * G + g) * os;
            }
        }
        pv_rows(wq, n, v, A, B, D, oq);
        for (int64_t j = j0; j < j1; j++)
            if (lo[j] < hi[j]) pv_row(j, G, w, ws, v, B, hi[j], D, o, os);
    }
}
#endif

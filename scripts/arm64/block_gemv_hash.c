/* A hash of inferd_block_gemv's output bits over 192 products (every weight width, block size,
 * scale kind, with and without offsets, 1 to 40 rows) of pseudo-random weights and activations,
 * the same on every machine: builds that keep the numeric definition print the same hash.
 * scripts/arm64/cross_check.sh compiles it for x86-64 and arm64 and compares. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels.h"

static uint64_t state = 88172645463325252ull;

static uint32_t next(void) { /* xorshift64: the same numbers on every machine */
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (uint32_t)(state >> 11);
}

static float value(void) { return ((int32_t)(next() % 20001) - 10000) / 4096.0f; }

static uint64_t fnv(uint64_t h, const void* data, size_t n) {
    const uint8_t* p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* y of M rows against a random N x K matrix of `bits` weights in blocks of B. */
static uint64_t product_hash(int64_t bits, int64_t B, int half_scales, int offsets, int64_t M) {
    const int64_t N = 16 * 5 + 7, K = 256, groups = (N + 15) / 16, scales = groups * K / B * 16;
    const int64_t q_bytes = groups * 16 * K * (bits == 8 ? 8 : 4) / 8;
    uint8_t* q = malloc(q_bytes);
    uint8_t* high = malloc(groups * 2 * K);
    uint16_t* scale16 = malloc(2 * scales);
    float* scale32 = malloc(4 * scales);
    float* offset = malloc(4 * scales);
    float* x = malloc(4 * M * K);
    float* y = malloc(4 * M * N);
    for (int64_t i = 0; i < q_bytes; i++) q[i] = (uint8_t)next();
    for (int64_t i = 0; i < groups * 2 * K; i++) high[i] = (uint8_t)next();
    for (int64_t i = 0; i < scales; i++) {
        scale16[i] = (uint16_t)((next() & 0x8000) | ((next() % 12 + 4) << 10) | (next() & 0x3FF));
        if (i % 97 == 0) scale16[i] = (uint16_t)(next() & 0x3FF); /* a subnormal */
        scale32[i] = value() / 64;
        offset[i] = value() / 32;
    }
    for (int64_t i = 0; i < M * K; i++) x[i] = value();
    const BlockMatrix W = {q, bits == 5 ? high : NULL,
                           half_scales ? (const void*)scale16 : (const void*)scale32,
                           offsets ? offset : NULL, N, K, B, bits,
                           bits == 8 ? 0 : bits == 4 ? 8 : 16, half_scales};
    if (inferd_block_gemv(x, M, &W, y, N) != 0) {
        fprintf(stderr, "inferd_block_gemv refused bits=%lld B=%lld\n", (long long)bits,
                (long long)B);
        exit(1);
    }
    const uint64_t h = fnv(1469598103934665603ull, y, 4 * (size_t)(M * N));
    free(q), free(high), free(scale16), free(scale32), free(offset), free(x), free(y);
    return h;
}

int main(void) {
    static const int64_t widths[] = {4, 5, 8}, blocks[] = {16, 32};
    static const int64_t rows[] = {1, 2, 3, 5, 8, 11, 17, 40};
    uint64_t total = 1469598103934665603ull;
    for (int w = 0; w < 3; w++)
        for (int b = 0; b < 2; b++)
            for (int half = 0; half < 2; half++)
                for (int off = 0; off < 2; off++)
                    for (int m = 0; m < 8; m++) {
                        const uint64_t h = product_hash(widths[w], blocks[b], half, off, rows[m]);
                        total = fnv(total, &h, sizeof h);
                    }
    printf("%016llx\n", (unsigned long long)total);
    return 0;
}

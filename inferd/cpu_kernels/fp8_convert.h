/* FP8 (e4m3fn) codes to floats in registers of the build's ISA (inferd): how fp8_gemm.c's tiles
 * read their weights. Internal: not part of the C ABI.
 *
 * An e4m3fn code (a sign, 4 exponent bits biased by 7, 3 mantissa bits) is exact in fp16 eight
 * binades lower: its sign bit moved to bit 15 and its other 7 bits to bits 7..13 make the fp16
 * number w' = w / 256, subnormals included (both formats' subnormals have the same form; the
 * fp16 exponent's top bit stays 0). AVX2 and AVX-512 make those bits with a sign extension, a
 * shift and an AND per 16 codes, then floats with F16C's vcvtph2ps; the portable C reads a table
 * of the same 256 floats. The NaN codes 0x7F and 0xFF become +-480/256 (fp8_gemm.c: their rows'
 * scales are NaN instead). Measured (codes in L2, two FMAs per 16 codes, one Zen 3 core): a
 * float table read by vgatherdps converts 2.2 G codes/s, the shifts and vcvtph2ps 11.5 G/s;
 * vcvtph2ps is still what that loop waits for (a fake conversion: 2.5x faster), and building
 * float32 bits instead (a shift, an AND, one multiply by 2^112 per 8 codes) was no faster and
 * slow on subnormal codes (denormal operands), besides depending on the MXCSR's DAZ bit. */
#ifndef INFERD_FP8_CONVERT_H
#define INFERD_FP8_CONVERT_H
#include <stdint.h>

#include "fixed_order.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#define F16C_CONVERSION 1
#endif

#if defined(__AVX512F__)
ALWAYS_INLINE reg rmul(reg a, reg b) { return _mm512_mul_ps(a, b); }
#elif defined(__AVX2__) && defined(__FMA__)
ALWAYS_INLINE reg rmul(reg a, reg b) { return _mm256_mul_ps(a, b); }
#else
ALWAYS_INLINE reg rmul(reg a, reg b) { return a * b; }
#endif

#ifdef INFERD_EMULATED_ISA /* tests/emulated_isa.h: unrolled SIMDe calls took GCC minutes */
#define UNROLL
#define UNROLL_K
#else
#define UNROLL _Pragma("GCC unroll 16")
#define UNROLL_K _Pragma("GCC unroll 4")
#endif

#ifndef F16C_CONVERSION
/* w' of each code: sign * (exponent ? (8 + mantissa) << (exponent - 1) : mantissa) * 2^-17 */
#define FP8_E(c) ((c) >> 3 & 15)
#define FP8_MAG(c) (FP8_E(c) ? ((8 + ((c) & 7)) << FP8_E(c)) >> 1 : ((c) & 7))
#define FP8_W(c) (((c) & 0x80 ? -1.0f : 1.0f) * (float)FP8_MAG((c) & 0x7F) * 0x1p-17f)
#define FP8_W4(c) FP8_W(c), FP8_W((c) + 1), FP8_W((c) + 2), FP8_W((c) + 3)
#define FP8_W16(c) FP8_W4(c), FP8_W4((c) + 4), FP8_W4((c) + 8), FP8_W4((c) + 12)
#define FP8_W64(c) FP8_W16(c), FP8_W16((c) + 16), FP8_W16((c) + 32), FP8_W16((c) + 48)
static const float FP8_TABLE[256] = {FP8_W64(0), FP8_W64(64), FP8_W64(128), FP8_W64(192)};
#endif

/* w' of the 16 codes at c (one input of a group) into a lane group's registers */
ALWAYS_INLINE void convert16(const uint8_t* c, reg w[PER_GROUP]) {
#ifdef F16C_CONVERSION
    /* sign-extended to 16 bits, << 7: bits 7..13 the code's low 7, bits 14-15 its sign */
    const __m256i s = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)c));
    const __m256i h = _mm256_and_si256(_mm256_slli_epi16(s, 7), _mm256_set1_epi16((short)0xBF80));
#if defined(__AVX512F__)
    w[0] = _mm512_cvtph_ps(h);
#else
    w[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    w[1] = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
#endif
#else
    float f[LANES];
    for (int r = 0; r < LANES; r++) f[r] = FP8_TABLE[c[r]];
    for (int j = 0; j < PER_GROUP; j++) w[j] = rload(f + j * REG);
#endif
}

/* w' of register j's codes of the 16 at c: c[j REG .. (j + 1) REG - 1] */
ALWAYS_INLINE reg convert_slice(const uint8_t* c, int j) {
#if defined(__AVX512F__)
    reg w[PER_GROUP];
    convert16(c, w);
    return w[j];
#elif defined(F16C_CONVERSION)
    const __m128i s = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i*)(c + 8 * j)));
    return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(s, 7), _mm_set1_epi16((short)0xBF80)));
#elif REG == 1
    return FP8_TABLE[c[j]];
#else
    float f[REG];
    for (int r = 0; r < REG; r++) f[r] = FP8_TABLE[c[j * REG + r]];
    return rload(f);
#endif
}

/* A group's 16 results of one row at y, of which the first `valid` are outputs (the rest are
 * the padding rows of the last group: never written, and read as 0). */
ALWAYS_INLINE void store_group(float* y, const reg* v, int64_t valid) {
    UNROLL
    for (int j = 0; j < PER_GROUP; j++) {
        const int64_t left = valid - j * REG;
        if (left >= REG) rstore(y + j * REG, v[j]);
        else if (left > 0) rstore_n(y + j * REG, v[j], left);
    }
}

ALWAYS_INLINE void load_group(const float* y, reg* v, int64_t valid) {
    UNROLL
    for (int j = 0; j < PER_GROUP; j++) {
        const int64_t left = valid - j * REG;
        v[j] = left >= REG ? rload(y + j * REG) : left > 0 ? rload_n(y + j * REG, left) : rzero();
    }
}

#endif

/* Force-included (-include) into every kernel source by tests/kernel_variants.py to build an ISA
 * variant's code on an AVX2 CPU that lacks it: SIMDe (cmeel-simde, the test extra) defines the
 * intrinsics the CPU has not as portable C under their usual names, then the feature macros
 * the sources select their code with are set, as the variant's target flags would set them.
 * Integer and IEEE operations give the same bits as the instructions, so each variant's tiles,
 * loops and tails are checked against the portable C on every machine, not only on CPUs with
 * the variant. (Slow: for checks only.) */
#ifndef INFERD_EMULATED_ISA_H
#define INFERD_EMULATED_ISA_H

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#undef I /* complex.h's, which SIMDe includes; the kernels name variables I */

#if defined(INFERD_EMULATE_AVX512)
#define __AVX512F__ 1
#define __AVX512BW__ 1
#define __AVX512VL__ 1
/* three intrinsics this SIMDe version lacks, from ones it has, */
static inline simde__m512i inferd_emulated_cvtepu8_epi16(simde__m256i a) {
    const simde__m256i lo = simde_mm256_cvtepu8_epi16(simde_mm256_castsi256_si128(a));
    const simde__m256i hi = simde_mm256_cvtepu8_epi16(simde_mm256_extracti128_si256(a, 1));
    return simde_mm512_inserti64x4(simde_mm512_castsi256_si512(lo), hi, 1);
}
#define _mm512_cvtepu8_epi16(a) inferd_emulated_cvtepu8_epi16(a)
static inline simde__m512i inferd_emulated_cvtepi8_epi32(simde__m128i a) {
    const simde__m256i lo = simde_mm256_cvtepi8_epi32(a);
    const simde__m256i hi = simde_mm256_cvtepi8_epi32(simde_mm_srli_si128(a, 8));
    return simde_mm512_inserti64x4(simde_mm512_castsi256_si512(lo), hi, 1);
}
#define _mm512_cvtepi8_epi32(a) inferd_emulated_cvtepi8_epi32(a)
#define _cvtu32_mask32(a) ((simde__mmask32)(a))
/* and one it gets wrong: its masked store writes zeros to the lanes left out */
static inline void inferd_emulated_mask_storeu_ps(void* to, simde__mmask16 keep, simde__m512 a) {
    float lanes[16];
    simde_mm512_storeu_ps(lanes, a);
    for (int i = 0; i < 16; i++)
        if (keep >> i & 1) ((float*)to)[i] = lanes[i];
}
#undef _mm512_mask_storeu_ps
#define _mm512_mask_storeu_ps(to, keep, a) inferd_emulated_mask_storeu_ps(to, keep, a)
#endif

#if defined(INFERD_EMULATE_AVX512_VNNI)
#define __AVX512VNNI__ 1
#endif

#if defined(INFERD_EMULATE_AVX_VNNI)
#define __AVXVNNI__ 1
/* AVX-VNNI's vpdpwssd is AVX512-VNNI's on 256 bits under another name */
#define _mm256_dpwssd_avx_epi32(src, a, b) simde_mm256_dpwssd_epi32(src, a, b)
#endif

#endif

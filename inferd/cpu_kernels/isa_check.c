/* Does this CPU have the features the library was compiled for? (inferd)
 *
 * build.py compiles this file apart from the kernels, with the architecture's baseline target
 * only, so the check itself runs on any CPU; -DINFERD_NEEDS_<FEATURE> says which features the
 * kernels' variant uses. It asks the CPU (cpuid, through the compiler's __builtin_cpu_supports,
 * which also checks that the OS saves the wider registers), independently of /proc/cpuinfo,
 * which Python reads to choose the variant. */
#include <stdint.h>
#include <string.h>

static void note(char* out, int64_t size, const char* name) {
    const size_t used = strlen(out), len = strlen(name);
    if (used + len + 2 >= (size_t)size) return;
    if (used) out[used] = ',', out[used + 1] = '\0';
    strcat(out, name);
}

#define CHECK(builtin_name, cpuinfo_name)                       \
    if (!__builtin_cpu_supports(builtin_name)) {                \
        note(out, size, cpuinfo_name);                          \
        missing++;                                              \
    }

/* Writes the missing features (comma separated, /proc/cpuinfo names) to out; returns how many
 * are missing (0: the library runs here). */
int inferd_kernel_missing_features(char* out, int64_t size) {
    int missing = 0;
    if (size > 0) out[0] = '\0';
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
#ifdef INFERD_NEEDS_AVX2
    CHECK("avx2", "avx2")
#endif
#ifdef INFERD_NEEDS_FMA
    CHECK("fma", "fma")
#endif
#ifdef INFERD_NEEDS_F16C
    CHECK("f16c", "f16c")
#endif
#ifdef INFERD_NEEDS_AVX_VNNI
    CHECK("avxvnni", "avx_vnni")
#endif
#ifdef INFERD_NEEDS_AVX512F
    CHECK("avx512f", "avx512f")
#endif
#ifdef INFERD_NEEDS_AVX512BW
    CHECK("avx512bw", "avx512bw")
#endif
#ifdef INFERD_NEEDS_AVX512VL
    CHECK("avx512vl", "avx512vl")
#endif
#ifdef INFERD_NEEDS_AVX512_VNNI
    CHECK("avx512vnni", "avx512_vnni")
#endif
#endif
    return missing;
}

#!/usr/bin/env bash
# The C kernels built for arm64 (where `portable` is what runs) against the x86-64 builds, on a
# machine without arm64 hardware: compile block_gemv_hash.c with the kernels for x86-64
# (`portable` and, where the CPU has it, `avx2`) and for arm64 (run under qemu), and check that
# all print the same hash, i.e. the same output bits. Needs gcc-aarch64-linux-gnu and qemu-user
# (apt). Prints how many NEON widening multiplies the arm64 block product got.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
kernels="$here/../../inferd/cpu_kernels"
out="$(mktemp -d)"
sources=$(ls "$kernels"/*.c | grep -v -e isa_check.c -e compact_bpe.c)
flags=(-O3 -fopenmp -std=c11 -fno-trapping-math -I"$kernels")
gcc "${flags[@]}" -march=x86-64 -mtune=generic $sources "$here/block_gemv_hash.c" -lm -o "$out/x86_portable"
aarch64-linux-gnu-gcc "${flags[@]}" $sources "$here/block_gemv_hash.c" -lm -static -o "$out/arm64_portable" 2>/dev/null
hashes=("x86-64 portable: $("$out/x86_portable")" "arm64 portable (qemu): $(qemu-aarch64 "$out/arm64_portable")")
if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && grep -qw f16c /proc/cpuinfo; then
    gcc "${flags[@]}" -march=x86-64 -mavx2 -mfma -mf16c $sources "$here/block_gemv_hash.c" -lm -o "$out/x86_avx2"
    hashes+=("x86-64 avx2: $("$out/x86_avx2")")
fi
printf '%s\n' "${hashes[@]}"
aarch64-linux-gnu-gcc "${flags[@]}" -c "$kernels/block_dot_portable.c" -o "$out/portable.o"
echo "arm64 block product: $(aarch64-linux-gnu-objdump -d "$out/portable.o" | grep -cE '\s(smull2?|smlal2?)\s') NEON widening multiplies"
rm -rf "$out"
[ "$(printf '%s\n' "${hashes[@]}" | awk '{print $NF}' | sort -u | wc -l)" = 1 ] && echo "same bits"

"""Facts about the CPU that choose defaults and kernels (no torch import: config-only tools and
`inferd doctor` use it too)."""

from __future__ import annotations

import functools
import platform

# The features that matter to inferd's kernels and dtypes, as /proc/cpuinfo spells them.
NOTABLE_FEATURES = ("avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl",
                    "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16", "asimd",
                    "asimddp")  # fmt: skip


@functools.cache
def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def _field(names: tuple[str, ...]) -> str:
    """The value of the first line starting with one of `names` (x86 and Arm spell them
    differently)."""
    for line in _cpuinfo().splitlines():
        key, _, value = line.partition(":")
        if key.strip() in names:
            return value.strip()
    return ""


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as the kernel reports them (empty where /proc/cpuinfo is not
    readable: nothing is assumed then)."""
    return frozenset(_field(("flags", "Features")).split())


def cpu_model() -> str:
    return _field(("model name", "Model Name")) or platform.processor() or platform.machine()


def machine() -> str:
    """The architecture, normalised: x86_64 or aarch64 (or whatever the platform says)."""
    arch = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)


def cpu_has_fast_bf16() -> bool:
    """avx512_bf16 or AMX: bf16 matrix products run at 2x float32 (or better) on such CPUs."""
    flags = cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def default_cpu_dtype() -> str:
    """What dtype=auto means on this CPU: bfloat16 where it is fast (its agreement with
    float32 is checked by tests/parity/test_quantization_accuracy.py), else float32."""
    return "bfloat16" if cpu_has_fast_bf16() else "float32"

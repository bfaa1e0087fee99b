"""Facts about the CPU that choose defaults and kernels (no torch import: config-only tools and
`inferd doctor` use it too).

`INFERD_CPU_FEATURES_OFF` makes inferd treat features as absent (space- or comma-separated
names as /proc/cpuinfo spells them, shell-style patterns allowed): every choice inferd makes
from the CPU's features (kernel variant, bf16 or not, the default weights) then is the one it
makes on a CPU without them, e.g. `'avx512* amx* avx_vnni'` for an AVX2-only machine. For tests
and measurements; PyTorch's own kernels still use the CPU as it is (ATEN_CPU_CAPABILITY,
ONEDNN_MAX_CPU_ISA and MKL_ENABLE_INSTRUCTIONS restrict those).
"""

from __future__ import annotations

import ctypes
import fnmatch
import functools
import os
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


FEATURES_OFF_ENV = "INFERD_CPU_FEATURES_OFF"


def features_off() -> tuple[str, ...]:
    """The patterns INFERD_CPU_FEATURES_OFF names (empty: none)."""
    return tuple(os.environ.get(FEATURES_OFF_ENV, "").replace(",", " ").split())


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as the kernel reports them, less those INFERD_CPU_FEATURES_OFF
    turns off (empty where /proc/cpuinfo is not readable: nothing is assumed then)."""
    disabled = disabled_by_os()
    flags = [f for f in _listed_flags() if f not in disabled]
    off = features_off()
    return frozenset(f for f in flags if not any(fnmatch.fnmatchcase(f, p) for p in off))


def _listed_flags() -> list[str]:
    """The flags /proc/cpuinfo lists (x86 and Arm name the line differently)."""
    return _field(("flags", "Features")).split()


def disabled_by_os() -> tuple[str, ...]:
    """The flags /proc/cpuinfo lists that this OS does not let a process use (AMX's, where
    os_enables_amx says no): inferd treats them as absent."""
    amx = tuple(f for f in _listed_flags() if f.startswith("amx"))
    return amx if amx and not os_enables_amx() else ()


@functools.cache
def os_enables_amx() -> bool:
    """Whether Linux supports AMX's tile state here. NOTE: /proc/cpuinfo lists what cpuid
    reports, and a VM's CPU may report AMX where the hypervisor or the OS never enabled it (its
    first instruction traps there), so the AMX flags count only where the kernel's supported
    extended states (arch_prctl ARCH_GET_XCOMP_SUPP, which changes nothing) include the tile
    data (XTILEDATA, bit 18)."""
    if machine() != "x86_64" or platform.system() != "Linux":
        return False
    try:
        mask = ctypes.c_uint64(0)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(158, 0x1021, ctypes.byref(mask)) != 0:  # SYS_arch_prctl, GET_XCOMP_SUPP
            return False
    except (OSError, AttributeError):
        return False
    return bool(mask.value >> 18 & 1)


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

"""Facts about the CPU that choose defaults (no torch import: config-only tools use it too)."""

from __future__ import annotations

import functools


@functools.cache
def cpu_has_fast_bf16() -> bool:
    """avx512_bf16 or AMX: bf16 matrix products run at 2x float32 (or better) on such CPUs."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def default_cpu_dtype() -> str:
    """What dtype=auto means on this CPU: bfloat16 where it is fast (its agreement with
    float32 is checked by tests/parity/test_quantization_accuracy.py), else float32."""
    return "bfloat16" if cpu_has_fast_bf16() else "float32"

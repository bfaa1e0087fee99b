"""The C kernels' ISA variants, for tests that run each one (cpu_kernels/variants.py).

Every variant is a parameter: portable runs everywhere a C compiler does, the SIMD ones where the
CPU has their features; a variant this CPU lacks is skipped, saying which features are missing
(CI on each machine runs what that machine can). A variant the CPU runs but that fails to build
is a failure, not a skip: that is a bug in the kernels or their flags.
"""

from __future__ import annotations

import ctypes

import pytest

from inferd.cpu_info import cpu_flags, machine
from inferd.cpu_kernels import build
from inferd.cpu_kernels.variants import BY_NAME, VARIANTS

VARIANT_NAMES = [v.name for v in VARIANTS]


def variant_library(name: str) -> ctypes.CDLL:
    missing = BY_NAME[name].missing(cpu_flags(), machine())
    if missing:
        pytest.skip(f"this CPU lacks {', '.join(missing)}, which the {name} kernels use")
    try:
        build.compiler()
    except build.KernelsUnavailable as e:
        pytest.skip(f"no C kernels here: {e}")
    return build.load_variant(name).lib

"""The C kernels' ISA variants, for tests that run each one (cpu_kernels/variants.py).

Every variant is a parameter: portable runs everywhere a C compiler does, the SIMD ones natively
where the CPU has their features. Where it lacks them, an AVX2 CPU still runs the variant's
code, emulated: SIMDe's C versions of the intrinsics (emulated_isa.h; `cmeel-simde` in the test
extra), so what each variant computes is checked on every CI machine, not only on CPUs that
have it; CI on such a CPU also runs it natively. A variant that can be neither run nor emulated
here is skipped, saying why. A variant that fails to build is a failure, not a skip: that is a
bug in the kernels or their flags.
"""

from __future__ import annotations

import ctypes
import functools
import sysconfig
from pathlib import Path

import pytest

from inferd.c_compiler import source_key
from inferd.cache import cache_dir
from inferd.cpu_info import cpu_flags, machine
from inferd.cpu_kernels import build
from inferd.cpu_kernels.variants import BY_NAME, VARIANTS, target_flags

VARIANT_NAMES = [v.name for v in VARIANTS]
SHIM = Path(__file__).with_name("emulated_isa.h")
# emulated_isa.h's switches for each variant an AVX2 CPU can emulate
EMULATED = {
    "avx512-vnni": ("INFERD_EMULATE_AVX512", "INFERD_EMULATE_AVX512_VNNI"),
    "avx512": ("INFERD_EMULATE_AVX512",),
    "avx2-vnni": ("INFERD_EMULATE_AVX_VNNI",),
}
HOST = BY_NAME["avx2"]  # what the emulated builds run on


def simde_include() -> Path | None:
    """The folder holding SIMDe's headers: the `cmeel-simde` wheel's, or the system's."""
    for folder in (Path(sysconfig.get_paths()["purelib"]) / "cmeel.prefix" / "include",
                   Path("/usr/include")):  # fmt: skip
        if (folder / "simde" / "x86" / "avx512.h").is_file():
            return folder
    return None


def emulated(name: str) -> bool:
    """Whether `name` runs emulated here (the CPU lacks it, but can emulate it)."""
    return bool(BY_NAME[name].missing(cpu_flags(), machine())) and name in EMULATED


def _compiler() -> str:
    try:
        return build.compiler()
    except build.KernelsUnavailable as e:
        pytest.skip(f"no C kernels here: {e}")


@functools.cache  # once per process: the key hashes every source (a skip is not cached)
def emulated_build(name: str) -> build.Kernels:
    """Variant `name`'s code built for HOST with its intrinsics emulated (cached like a real
    variant's library, under a name that says it is emulated)."""
    lacks = ", ".join(BY_NAME[name].missing(cpu_flags(), machine()))
    if HOST.missing(cpu_flags(), machine()):
        pytest.skip(f"this CPU lacks {lacks}, which the {name} kernels use, and cannot emulate "
                    "them (that needs an AVX2 CPU)")  # fmt: skip
    include = simde_include()
    if include is None:
        pytest.skip(f"this CPU lacks {lacks}, which the {name} kernels use; emulating them needs "
                    "SIMDe's headers (pip install cmeel-simde, in the test extra)")  # fmt: skip
    cc = _compiler()
    flags = (*build.FLAGS, *target_flags(HOST), "-Wno-psabi", f"-I{include}",
             "-include", str(SHIM), "-DINFERD_EMULATED_ISA",
             *(f"-D{switch}" for switch in EMULATED[name]))  # fmt: skip
    simde = include / "simde" / "simde-common.h"  # holds SIMDe's version
    key = source_key([*build.SOURCES, *build.HEADERS, build.CHECK_SOURCE, SHIM, simde],
                     build.compiler_version(cc), " ".join(flags))  # fmt: skip
    path = cache_dir() / "kernels" / f"inferd_kernels-emulated-{name}-{key}.so"
    what = f"the {name} CPU kernels, emulated"
    seconds = build.compile_library(cc, path, flags, HOST.needs, what)
    return build.Kernels(build.load(path, name), name, path, seconds, "emulated")


def variant_kernels(name: str) -> build.Kernels:
    """Variant `name`'s kernels: native where this CPU has it, else emulated, else a skip."""
    if emulated(name):
        return emulated_build(name)
    missing = BY_NAME[name].missing(cpu_flags(), machine())
    if missing:
        pytest.skip(f"this CPU lacks {', '.join(missing)}, which the {name} kernels use")
    _compiler()
    return build.load_variant(name)


def variant_library(name: str) -> ctypes.CDLL:
    return variant_kernels(name).lib


def use_variant(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Make inferd's own kernel choice (INFERD_CPU_KERNELS) give variant `name` in this
    process, emulated where this CPU lacks it."""
    kernels = variant_kernels(name)
    monkeypatch.setenv("INFERD_CPU_KERNELS", name)
    if emulated(name):  # the variant check in build.choose would refuse it
        monkeypatch.setattr(build, "_kernels_for", lambda request: kernels)


def available_variants() -> list[str]:
    """The variants this machine runs, natively or emulated (best first; portable last)."""
    here = [v for v in VARIANT_NAMES if not BY_NAME[v].missing(cpu_flags(), machine())]
    if simde_include() is not None and not HOST.missing(cpu_flags(), machine()):
        here += [v for v in EMULATED if v not in here]
    return [v for v in VARIANT_NAMES if v in here]

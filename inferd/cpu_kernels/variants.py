"""The ISA variants the C kernels are built for, and which one this CPU gets.

Each variant is compiled with explicit target flags (never `-march=native`), so a library built
on one machine means the same on every machine that shares the cache, and its cache name says
which variant it is. At load the CPU's features decide: the best variant whose features it has.
`INFERD_CPU_KERNELS` overrides that (tests, bug reports): `auto` (the default), one variant's
name, or `0` for no C kernels at all (PyTorch ops everywhere).
"""

from __future__ import annotations

from dataclasses import dataclass

from inferd.cpu_info import cpu_flags, machine

ENV = "INFERD_CPU_KERNELS"
AUTO = ("", "auto", "1")
OFF = ("0", "off", "none")


@dataclass(frozen=True)
class Variant:
    name: str
    flags: tuple[str, ...]  # target flags, after the baseline of the architecture
    needs: tuple[str, ...]  # CPU features, as /proc/cpuinfo names them (x86 only when any)

    def missing(self, features: frozenset[str], arch: str) -> list[str]:
        """What this CPU lacks to run the variant (empty: it runs)."""
        if self.needs and arch != "x86_64":
            return [f"an x86-64 CPU (this is {arch})"]
        return [f for f in self.needs if f not in features]


# NOTE: the baseline pins the target's floor, whatever the compiler's own default: a compiler
# configured for a newer CPU would otherwise put its instructions into every variant.
X86_BASELINE = ("-march=x86-64", "-mtune=generic")
_AVX2 = ("-mavx2", "-mfma", "-mf16c")
_AVX2_NEEDS = ("avx2", "fma", "f16c")
_AVX512 = (*_AVX2, "-mavx512f", "-mavx512bw", "-mavx512vl")
_AVX512_NEEDS = (*_AVX2_NEEDS, "avx512f", "avx512bw", "avx512vl")

# Best first. block_layout.h maps the flags to the inner loop each one gets.
VARIANTS = (
    Variant("avx512-vnni", (*_AVX512, "-mavx512vnni"), (*_AVX512_NEEDS, "avx512_vnni")),
    Variant("avx512", _AVX512, _AVX512_NEEDS),
    Variant("avx2-vnni", (*_AVX2, "-mavxvnni"), (*_AVX2_NEEDS, "avx_vnni")),
    Variant("avx2", _AVX2, _AVX2_NEEDS),
    Variant("portable", (), ()),
)
BY_NAME = {v.name: v for v in VARIANTS}


def target_flags(variant: Variant, arch: str | None = None) -> tuple[str, ...]:
    """The compiler's target flags for `variant` on this architecture."""
    arch = arch or machine()
    return (*X86_BASELINE, *variant.flags) if arch == "x86_64" else variant.flags


def runnable(features: frozenset[str] | None = None, arch: str | None = None) -> list[Variant]:
    """The variants this CPU runs, best first (portable always)."""
    features = cpu_flags() if features is None else features
    arch = arch or machine()
    return [v for v in VARIANTS if not v.missing(features, arch)]


def requested(value: str | None) -> str:
    """The INFERD_CPU_KERNELS value, normalised: 'auto', 'off' or a variant's name. Raises
    ValueError naming the accepted values for anything else."""
    value = (value or "").strip().lower()
    if value in AUTO:
        return "auto"
    if value in OFF:
        return "off"
    if value not in BY_NAME:
        choices = ", ".join(["auto", "0", *BY_NAME])
        raise ValueError(f"{ENV} must be one of {choices}; got {value!r}")
    return value


def describe(features: frozenset[str] | None = None, arch: str | None = None) -> list[str]:
    """One line per variant: runs here, or what it needs (for `inferd doctor`)."""
    features = cpu_flags() if features is None else features
    arch = arch or machine()
    lines = []
    for v in VARIANTS:
        missing = v.missing(features, arch)
        verdict = "needs " + ", ".join(missing) if missing else "runs here"
        lines.append(f"{v.name}: {verdict}")
    return lines

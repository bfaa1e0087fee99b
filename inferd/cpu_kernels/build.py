"""Compile and load the C kernels: one library per ISA variant (variants.py).

A variant is compiled once per (sources, compiler, flags) into `$INFERD_CACHE/kernels/`, under a
name that says which variant it is (`inferd_kernels-avx2-<hash>.so`); later processes load it in
milliseconds. Nothing in the key depends on the machine that built it, so a cache shared by
different CPUs is safe: each loads the variant it runs, and a library is refused at load (with
the reason) unless the CPU has every feature it was compiled for. That check is a small C file
compiled for the architecture's baseline (isa_check.c), so it runs even where the kernels
would not.

The library links the same OpenMP runtime PyTorch already loaded (`libgomp.so.1`), so kernels and
PyTorch share one thread pool instead of two pools fighting over the cores. Why ctypes rather
than a PyTorch C++ extension: the kernels need no PyTorch headers, and plain C files compile in
seconds instead of minutes.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch  # noqa: F401  (loaded first, so its OpenMP runtime is the one the kernels bind to)

import inferd.c_compiler as c_compiler
from inferd.c_compiler import NoCompiler, find_compiler, run_compiler, source_key
from inferd.cache import cache_dir, publish, verified
from inferd.cpu_info import cpu_flags, machine
from inferd.cpu_kernels.variants import BY_NAME, ENV, Variant, requested, runnable, target_flags
from inferd.progress import status

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
CHECK_SOURCE = HERE / "isa_check.c"
SOURCES = sorted(p for p in HERE.glob("*.c") if p != CHECK_SOURCE)
HEADERS = sorted(HERE.glob("*.h"))
# -std=c11 (not gnu11) also means no contraction into FMAs, so vector and scalar code give the
# same bits; -fno-trapping-math lets selects vectorise (vec_exp.h) and changes no result.
FLAGS = ("-O3", "-fopenmp", "-fPIC", "-std=c11", "-fno-trapping-math",
         "-Werror=implicit-function-declaration")  # fmt: skip


class KernelsUnavailable(RuntimeError):
    """The C kernels cannot be used here (no compiler, a failed build, a CPU without the
    variant's features, or turned off); says why."""


@dataclass(frozen=True)
class Kernels:
    """A loaded kernel library and how it came to be."""

    lib: ctypes.CDLL
    variant: str
    path: Path
    build_seconds: float | None  # None: loaded from the cache
    reason: str  # why this variant

    def status(self) -> str:
        how = "cached" if self.build_seconds is None else f"built in {self.build_seconds:.1f} s"
        return f"cpu kernels: {self.variant} ({how})"


def compiler() -> str:
    try:
        return find_compiler()
    except NoCompiler as e:
        raise KernelsUnavailable(str(e)) from None


def compiler_version(cc: str) -> str:
    """The compiler's `--version` banner (part of every library's cache key)."""
    try:
        return c_compiler.compiler_version(cc)
    except NoCompiler as e:
        raise KernelsUnavailable(str(e)) from None


def library_path(variant: Variant, cc: str) -> Path:
    parts = (variant.name, compiler_version(cc), " ".join(FLAGS + target_flags(variant)))
    key = source_key([*SOURCES, *HEADERS, CHECK_SOURCE], *parts)
    return cache_dir() / "kernels" / f"inferd_kernels-{variant.name}-{key}.so"


def _run(cmd: list[str], what: str) -> None:
    try:
        run_compiler(cmd, what)
    except NoCompiler as e:
        raise KernelsUnavailable(str(e)) from None


def _compile_sources(cc: str, flags: tuple[str, ...], what: str, folder: Path) -> list[Path]:
    """Each source compiled to an object file in `folder`, as many at once as there are
    cores. NOTE: one compiler call for all of them ran one after the other, ~8 s for the
    `avx2` variant on a 2-core AMD EPYC, 6 of them for block_dot_avx2.c (its unrolled tiles);
    the largest files start first, so the others fill the remaining cores meanwhile."""
    sources = sorted(SOURCES, key=lambda p: p.stat().st_size, reverse=True)
    objects = [folder / f"{source.stem}.o" for source in sources]

    def compile_one(source: Path, obj: Path) -> None:
        _run([cc, *flags, "-c", str(source), "-o", str(obj)], f"{what} ({source.name})")

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for done in [pool.submit(compile_one, s, o) for s, o in zip(sources, objects)]:
            done.result()  # raises the first failure
    return objects


def build(variant: Variant | str) -> tuple[Path, float | None]:
    """Compile `variant` (unless cached); returns the library's path and the seconds the build
    took (None when it was cached)."""
    variant = BY_NAME[variant] if isinstance(variant, str) else variant
    cc = compiler()
    path = library_path(variant, cc)
    seconds = compile_library(cc, path, FLAGS + target_flags(variant), variant.needs,
                              f"inferd's {variant.name} CPU kernels")  # fmt: skip
    return path, seconds


def compile_library(cc: str, path: Path, flags: tuple[str, ...], needs: tuple[str, ...],
                    what: str) -> float | None:  # fmt: skip
    """Compile the sources with `flags` into the library `path`, whose feature check refuses a
    CPU without `needs`; returns the seconds it took, None when `path` was already built.
    (build() for a variant; the tests also build its code on CPUs without it, emulated.)"""
    # NOTE: a damaged library would crash the process when loaded (SIGSEGV, SIGBUS), so only
    # one that matches the checksum written with it is ever opened (inferd/cache.py).
    if verified(path):
        return None
    t0 = time.monotonic()
    path.parent.mkdir(parents=True, exist_ok=True)
    baseline = target_flags(BY_NAME["portable"])
    defines = [f"-DINFERD_NEEDS_{f.upper()}" for f in needs]
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        check, out = Path(tmp) / "isa_check.o", Path(tmp) / path.name
        with status(f"compiling {what} (once per CPU and compiler)"):
            _run([cc, "-O2", "-fPIC", "-std=c11", *baseline, *defines, "-c", str(CHECK_SOURCE),
                  "-o", str(check)], "the CPU feature check")  # fmt: skip
            objects = _compile_sources(cc, flags, what, Path(tmp))
            _run([cc, *flags, "-shared", *map(str, objects), str(check), "-o", str(out), "-lm"],
                 what)  # fmt: skip
        try:  # checksum, then an atomic rename: no process loads a half-written file
            publish(out, path)
        except OSError as e:
            raise KernelsUnavailable(f"cannot write the compiled kernels to {path}: {e}") from e
    seconds = time.monotonic() - t0
    log.info("built %s in %.1f s: %s", what, seconds, path)
    return seconds


def load(path: Path, variant: str | None = None) -> ctypes.CDLL:
    """Open a built library and declare its functions. Refuses (KernelsUnavailable) a library
    whose ISA this CPU lacks, or that is not the variant asked for."""
    lib = ctypes.CDLL(str(path))
    ptr, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    lib.inferd_kernel_missing_features.argtypes = [ctypes.c_char_p, i64]
    lib.inferd_kernel_missing_features.restype = ctypes.c_int
    missing = ctypes.create_string_buffer(256)
    # NOTE: nothing else in the library may run before this check passes.
    if lib.inferd_kernel_missing_features(missing, len(missing)):
        raise KernelsUnavailable(f"{path.name} needs CPU features this CPU lacks: "
                                 f"{missing.value.decode()}")  # fmt: skip
    lib.inferd_kernel_isa.restype = ctypes.c_char_p
    isa = lib.inferd_kernel_isa().decode()
    if variant is not None and isa != variant:
        raise KernelsUnavailable(f"{path.name} was asked for {variant} but holds {isa} code "
                                 "(does the compiler honour the target flags?)")  # fmt: skip
    lib.inferd_block_gemv.argtypes = [ptr, i64, ptr, ptr, i64]
    lib.inferd_block_gemv.restype = ctypes.c_int
    lib.inferd_rms_norm.argtypes = [ptr, ptr, i64, i64, f32, ptr]
    lib.inferd_rms_norm.restype = None
    lib.inferd_paged_attention.argtypes = [ptr] * 6
    lib.inferd_paged_attention.restype = ctypes.c_int
    lib.inferd_block_dequantize.argtypes = [ptr, i64, i64, i64, ptr]
    lib.inferd_block_dequantize.restype = None
    lib.inferd_argmax_rows.argtypes = [ptr, i64, i64, ptr]
    lib.inferd_argmax_rows.restype = None
    lib.inferd_rope_tables.argtypes = [ptr, i64, ptr, i64, ptr, ptr]
    lib.inferd_rope_tables.restype = None
    lib.inferd_decode_layer.argtypes = [ptr, ptr, ptr]
    lib.inferd_decode_layer.restype = ctypes.c_int
    lib.inferd_decode_layers.argtypes = [i64, ptr, ptr, ptr]
    lib.inferd_decode_layers.restype = ctypes.c_int
    lib.inferd_fp8_gemm.argtypes = [ptr, i64, ptr, ptr, i64]
    lib.inferd_fp8_gemm.restype = ctypes.c_int
    lib.inferd_kv_int8_quantize.argtypes = [ptr, i64, i64, ptr]
    lib.inferd_kv_int8_quantize.restype = None
    return lib


def load_variant(variant: Variant | str, reason: str = "") -> Kernels:
    """Build (unless cached) and load one variant."""
    variant = BY_NAME[variant] if isinstance(variant, str) else variant
    path, seconds = build(variant)
    return Kernels(load(path, variant.name), variant.name, path, seconds, reason)


def choose(request: str) -> Kernels:
    """The kernels for an INFERD_CPU_KERNELS value (normalised by variants.requested)."""
    if request == "off":
        raise KernelsUnavailable(f"turned off by {ENV}=0")
    candidates = runnable()
    if request != "auto":
        if BY_NAME[request] not in candidates:
            lacks = ", ".join(BY_NAME[request].missing(cpu_flags(), machine()))
            raise KernelsUnavailable(f"{ENV}={request}, but this CPU lacks {lacks}")
        return load_variant(request, f"forced by {ENV}={request}")
    failures = []
    for variant in candidates:  # best first; a variant the compiler cannot build falls through
        reason = "the best variant this CPU runs" + (f" that builds ({'; '.join(failures)})"
                                                     if failures else "")  # fmt: skip
        try:
            return load_variant(variant, reason)
        except (KernelsUnavailable, OSError) as e:
            if variant.name == "portable" or "no C compiler" in str(e):
                raise KernelsUnavailable(str(e)) from e
            log.warning("the %s CPU kernels are unusable here (%s); trying the next variant",
                        variant.name, str(e).splitlines()[0])  # fmt: skip
            failures.append(f"{variant.name}: {str(e).splitlines()[0]}")
    raise AssertionError("portable is always a candidate")


@functools.cache
def _kernels_for(request: str) -> Kernels | KernelsUnavailable:
    """Once per process and INFERD_CPU_KERNELS value; a failure is remembered too."""
    try:
        return choose(request)
    except (KernelsUnavailable, OSError) as e:
        return e if isinstance(e, KernelsUnavailable) else KernelsUnavailable(str(e))


def current_kernels() -> Kernels:
    """The kernels INFERD_CPU_KERNELS asks for (default: the best this CPU runs); raises
    KernelsUnavailable with the reason, ValueError for an INFERD_CPU_KERNELS value that names
    nothing."""
    found = _kernels_for(requested(os.environ.get(ENV)))
    if isinstance(found, KernelsUnavailable):
        raise found
    return found


def kernel_library() -> ctypes.CDLL:
    """The loaded library; raises KernelsUnavailable with the reason."""
    try:
        return current_kernels().lib
    except ValueError as e:
        raise KernelsUnavailable(str(e)) from e


def kernels_available() -> bool:
    try:
        kernel_library()
    except KernelsUnavailable:
        return False
    return True

"""Compile and load the C kernels.

The source is compiled once per (source, compiler, CPU) into `$INFERD_CACHE/kernels/` with
`-O3 -march=native -fopenmp`; later processes load the cached library in milliseconds. The
library links the same OpenMP runtime PyTorch already loaded (`libgomp.so.1`), so kernels and
PyTorch share one thread pool instead of two pools fighting over the cores.

Why ctypes rather than a PyTorch C++ extension: the kernels need no PyTorch headers, and a plain C
file compiles in under a second instead of a minute.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch  # noqa: F401  (loaded first, so its OpenMP runtime is the one the kernels bind to)

log = logging.getLogger(__name__)

SOURCES = sorted(Path(__file__).parent.glob("*.c"))
HEADERS = sorted(Path(__file__).parent.glob("*.h"))
FLAGS = [
    "-O3",
    "-march=native",
    "-fopenmp",
    "-shared",
    "-fPIC",
    "-std=c11",
    "-Werror=implicit-function-declaration",
]


class KernelsUnavailable(RuntimeError):
    """The C kernels could not be built here (no compiler, or it failed); says why."""


def _compiler() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise KernelsUnavailable("no C compiler found (install gcc, or set CC)")


def _cpu_signature() -> str:
    """What -march=native depends on: the CPU model and its feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(lines)))


def _library_path(compiler: str, extra_flags: tuple[str, ...]) -> Path:
    from inferd.cache import cache_dir

    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256()
    for part in [s.read_bytes() for s in SOURCES + HEADERS] + [
        version.encode(),
        _cpu_signature().encode(),
        " ".join(FLAGS + list(extra_flags)).encode(),
    ]:
        key.update(part)
    return cache_dir() / "kernels" / f"inferd_kernels-{key.hexdigest()[:16]}.so"


def build(extra_flags: tuple[str, ...] = ()) -> Path:
    """Compile (unless cached) and return the library's path. `extra_flags` override the target
    (tests build the portable version with `-mno-avx512f`)."""
    compiler = _compiler()
    path = _library_path(compiler, extra_flags)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        out = Path(tmp) / path.name
        cmd = [compiler, *FLAGS, *extra_flags, *map(str, SOURCES), "-o", str(out), "-lm"]
        from inferd.progress import status

        with status("compiling inferd's CPU kernels (once per CPU and compiler)"):
            result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise KernelsUnavailable(f"compiling the CPU kernels failed:\n{result.stderr[-2000:]}")
        os.replace(out, path)  # atomic: concurrent processes never load a half-written file
    log.info("built CPU kernels %s", path)
    return path


def load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.inferd_block_gemv.argtypes = [ptr, i64, ptr, ptr, i64]
    lib.inferd_block_gemv.restype = ctypes.c_int
    lib.inferd_kernel_isa.restype = ctypes.c_char_p
    lib.inferd_rms_norm.argtypes = [ptr, ptr, i64, i64, ctypes.c_float, ptr]
    lib.inferd_rms_norm.restype = None
    lib.inferd_decode_attention.argtypes = (
        [ptr] * 6 + [i64] * 6 + [ctypes.c_float, i64, ctypes.c_float, i64, ptr]
    )
    lib.inferd_decode_attention.restype = ctypes.c_int
    lib.inferd_block_dequantize.argtypes = [ptr, i64, ptr]
    lib.inferd_block_dequantize.restype = None
    lib.inferd_argmax_rows.argtypes = [ptr, i64, i64, ptr]
    lib.inferd_argmax_rows.restype = None
    lib.inferd_decode_layer.argtypes = [ptr, ptr, ptr]
    lib.inferd_decode_layer.restype = ctypes.c_int
    return lib


@functools.cache
def _cached_library() -> ctypes.CDLL | KernelsUnavailable:
    """Built once per process; a failure is remembered too (and logged once)."""
    if os.environ.get("INFERD_CPU_KERNELS", "1") == "0":
        return KernelsUnavailable("turned off by INFERD_CPU_KERNELS=0")
    try:
        lib = load(build())
    except (KernelsUnavailable, OSError) as e:
        log.info("inferd's C kernels are unavailable (%s); using PyTorch ops instead", e)
        return e if isinstance(e, KernelsUnavailable) else KernelsUnavailable(str(e))
    log.info("CPU kernels: %s", lib.inferd_kernel_isa().decode())
    return lib


def kernel_library() -> ctypes.CDLL:
    """The built library for this machine; raises KernelsUnavailable with the reason."""
    lib = _cached_library()
    if isinstance(lib, KernelsUnavailable):
        raise lib
    return lib


def kernels_available() -> bool:
    return not isinstance(_cached_library(), KernelsUnavailable)

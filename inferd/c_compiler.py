"""The machine's C compiler, for inferd's own C code (the CPU kernels, the compact tokenizer):
found once, and named with its version in every cache key, so a library built by another
compiler is never taken for this one's. No PyTorch here: the tokenizer is built without it."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path


class NoCompiler(RuntimeError):
    """No usable C compiler, or it failed; says why."""


def find_compiler() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise NoCompiler("no C compiler found (install gcc, or set CC)")


@functools.cache
def compiler_version(cc: str) -> str:
    """The compiler's `--version` banner (part of every library's cache key)."""
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.strip()
    except OSError as e:
        raise NoCompiler(f"cannot run the C compiler {cc!r}: {e}") from e


def run_compiler(cmd: list[str], what: str) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise NoCompiler(f"compiling {what} failed:\n{result.stderr[-2000:]}")


def source_key(paths: list[Path], *parts: str) -> str:
    """A hex key over the files' names and contents and `parts` (flags, compiler banner)."""
    import hashlib

    key = hashlib.sha256()
    for path in paths:
        key.update(path.name.encode() + b"\0" + path.read_bytes())
    for part in parts:
        key.update(b"\0" + part.encode())
    return key.hexdigest()[:16]

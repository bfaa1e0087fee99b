"""Giving freed memory back to the OS when an engine loop goes idle, or a load has ended.

glibc keeps what threads freed in their malloc arenas (up to 64 MiB each), so a busy spell leaves
resident memory behind that no one uses; `malloc_trim` hands the free pages back (a few
milliseconds, only between bursts). Elsewhere (musl, macOS, Windows) there is nothing to call.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where there is none."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def trim_now() -> None:
    """Hand the free pages of every arena back now (after a load: its temporaries)."""
    trim = malloc_trim()
    if trim is not None:
        trim(0)

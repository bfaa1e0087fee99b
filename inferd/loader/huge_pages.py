"""Moving mapped weights into huge pages, in place, beside the engine's work.

Why: decoding one row reads every weight once per token, and the LM head alone (178 MB for the
embedded model) streams from memory at a rate that address translation limits when it sits in
4 KiB pages, as a mapped file does. The same bytes in 2 MiB pages need 512 times fewer
translations; a decode step measured a few percent faster with its blocks there
(docs/performance.md).

How: a mapped weight-cache entry (loader/weight_cache.py) is left as it is for start-up; a
thread then copies it, `CHUNK` bytes at a time, into anonymous memory advised for huge pages
and moves that memory over the mapping's own addresses (Linux `mremap`). Every pointer into the
weights (torch tensors, the C kernels' structs) stays valid: the same addresses show the same
bytes before, during and after each move, so the engine keeps running meanwhile.

What it costs: one copy (~0.1 s of one core for the embedded model), up to `CHUNK` bytes more
memory while it runs, and the pages become this process's own: processes on one machine no
longer share the page cache's copy of the entry. `INFERD_HUGE_PAGES=0` keeps the mapping as it
is. Elsewhere than on Linux with transparent huge pages, nothing happens.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20  # a PMD-sized huge page on x86-64 and on arm64 with 4 KiB pages
CHUNK = 64 << 20  # moved at a time: bounds the extra memory while moving
_PROT_READ_WRITE = 0x1 | 0x2
_MADV_HUGEPAGE = 14
_MREMAP_MAYMOVE_FIXED = 0x1 | 0x2
_THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_OVERCOMMIT = Path("/proc/sys/vm/overcommit_memory")


def enabled() -> bool:
    """Whether moving can help here, and is safe (`why_not` says why not)."""
    return why_not() is None


def why_not() -> str | None:
    """Why weights stay in small pages here, or None where they move: asked for, Linux, huge
    pages not turned off, and memory not under strict accounting.

    NOTE: `mremap` onto an existing mapping unmaps the destination first and then moves. The
    kernel checks the mapping count before it unmaps; what can still refuse afterwards is the
    accounting of the moved memory, which can fail for a 64 MiB chunk only under strict
    overcommit (mode 2, hence not there), and the kernel's own small allocations, which fail
    only where it is out of memory altogether."""
    if os.environ.get("INFERD_HUGE_PAGES", "1") in ("0", "false", "no"):
        return "INFERD_HUGE_PAGES=0"
    if not sys.platform.startswith("linux"):
        return f"not Linux ({sys.platform})"
    try:
        thp = _THP_SETTING.read_text()
        overcommit = _OVERCOMMIT.read_text().strip()
    except OSError as e:
        return f"the kernel's settings are unreadable: {e}"
    if "[never]" in thp:
        return f"transparent huge pages are off ({_THP_SETTING}: never)"
    if overcommit == "2":
        return f"strict overcommit ({_OVERCOMMIT}: 2)"
    return None


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]  # fmt: skip
    libc.mremap.restype = ctypes.c_void_p
    libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int,
                            ctypes.c_void_p]  # fmt: skip
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def _aligned_anonymous(libc: ctypes.CDLL, length: int) -> int:
    """The address of `length` bytes of fresh private memory, aligned to a huge page and
    advised for huge pages. Raises OSError when the OS refuses."""
    failed = ctypes.c_void_p(-1).value
    raw = libc.mmap(None, length + HUGE_PAGE, _PROT_READ_WRITE,
                    mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)  # fmt: skip
    if raw in (None, failed):
        raise OSError(ctypes.get_errno(), "mmap of anonymous memory failed")
    start = -(-raw // HUGE_PAGE) * HUGE_PAGE
    head, tail = start - raw, raw + HUGE_PAGE - start  # the unaligned ends, together HUGE_PAGE
    if head:
        libc.munmap(raw, head)
    if tail:
        libc.munmap(start + length, tail)
    libc.madvise(start, length, _MADV_HUGEPAGE)
    return start


def move_into_huge_pages(mapped: mmap.mmap) -> int:
    """Move the part of `mapped` that whole huge pages cover into huge-page memory at the same
    addresses; the number of bytes moved. Raises OSError where the OS refuses a step: what was
    moved by then stays moved, the rest stays mapped, the bytes are unchanged either way (see
    `why_not` for the one case where a refused move would not leave its destination mapped)."""
    libc = _libc()
    # NOTE: the ctypes view holds an export of `mapped` while we copy: mmap.close() refuses to
    # unmap memory a copy is reading.
    view = (ctypes.c_char * len(mapped)).from_buffer(mapped)
    try:
        address = ctypes.addressof(view)
        start = -(-address // HUGE_PAGE) * HUGE_PAGE
        end = (address + len(mapped)) // HUGE_PAGE * HUGE_PAGE
        for at in range(start, end, CHUNK):
            length = min(CHUNK, end - at)
            fresh = _aligned_anonymous(libc, length)
            ctypes.memmove(fresh, at, length)
            if libc.mremap(fresh, length, length, _MREMAP_MAYMOVE_FIXED, at) != at:
                error = ctypes.get_errno()
                libc.munmap(fresh, length)
                raise OSError(error, "mremap onto the mapped weights failed")
        return max(0, end - start)
    finally:
        del view


def start_moving(mapped: mmap.mmap, what: str) -> threading.Thread | None:
    """Move `mapped` into huge pages in a daemon thread (see the module's docstring); the
    thread, or None where moving is off or cannot help."""
    if not enabled() or len(mapped) < HUGE_PAGE:
        return None

    def run() -> None:
        began = time.perf_counter()
        try:
            moved = move_into_huge_pages(mapped)
            log.debug("%s: %d MiB moved into huge pages in %.2f s", what, moved >> 20,
                      time.perf_counter() - began)  # fmt: skip
        except (OSError, ValueError, TypeError) as e:  # the mapping serves as it is
            log.debug("%s: left in small pages: %s", what, e)

    thread = threading.Thread(target=run, name="inferd-huge-pages", daemon=True)
    thread.start()
    return thread

"""What a process holds at one moment: on CPU its resident set (from /proc) and glibc's heap
(the allocator under PyTorch's CPU tensors); on CUDA what PyTorch's caching allocator has
allocated and reserved, and what the device has in use altogether.

The CUDA figures come from a `DeviceStats` object, `torch.cuda` itself unless a test hands in
a fake one, so the CUDA branch is exercised without a GPU.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass
from typing import Any, Protocol


class DeviceStats(Protocol):
    """The slice of `torch.cuda` that measuring reads (torch.cuda has exactly these)."""

    def synchronize(self) -> None: ...

    def memory_allocated(self) -> int: ...

    def memory_reserved(self) -> int: ...

    def max_memory_allocated(self) -> int: ...

    def max_memory_reserved(self) -> int: ...

    def reset_peak_memory_stats(self) -> None: ...

    def mem_get_info(self) -> tuple[int, int]: ...


def proc_status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS, VmHWM (peak), RssAnon and RssFile of a process (this one) in bytes; {} without
    /proc."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                    out[key] = int(value.split()[0]) * 1024  # reported in kB
    except OSError:
        pass
    return out


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux ≥ 4.0), so a later peak belongs to what ran since."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]  # fmt: skip


def heap_stats() -> tuple[int, int] | None:
    """glibc's heap (PyTorch's CPU tensors come from it): (bytes in use, bytes held from the
    system: in use + freed but kept for reuse); None without glibc ≥ 2.33 (`mallinfo2`).
    Large blocks are mmapped one by one and count in both."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError, TypeError):
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return info.uordblks + info.hblkhd, info.arena + info.hblkhd


@dataclass(frozen=True)
class Snapshot:
    label: str
    rss: int | None = None
    rss_peak: int | None = None
    rss_anon: int | None = None
    rss_file: int | None = None
    heap_in_use: int | None = None  # glibc malloc: bytes allocated
    heap_held: int | None = None  # ... and bytes taken from the system (in use + cached)
    cuda_allocated: int | None = None
    cuda_reserved: int | None = None
    cuda_peak: int | None = None  # most allocated since the last reset
    cuda_peak_reserved: int | None = None
    cuda_device_used: int | None = None  # total - free on the device: context and others too


def take_snapshot(label: str, device: str, stats: DeviceStats | None = None) -> Snapshot:
    """`stats`: where CUDA figures come from (default torch.cuda); unused on CPU."""
    st = proc_status()
    heap = heap_stats() or (None, None)
    cuda: dict[str, Any] = {}
    if device == "cuda":
        stats = stats or _torch_cuda()
        stats.synchronize()
        free, total = stats.mem_get_info()
        cuda = dict(
            cuda_allocated=stats.memory_allocated(),
            cuda_reserved=stats.memory_reserved(),
            cuda_peak=stats.max_memory_allocated(),
            cuda_peak_reserved=stats.max_memory_reserved(),
            cuda_device_used=total - free,
        )
    return Snapshot(label, st.get("VmRSS"), st.get("VmHWM"), st.get("RssAnon"),
                    st.get("RssFile"), *heap, **cuda)  # fmt: skip


def peak_snapshot(done: Snapshot) -> Snapshot:
    """The peaks `done` carries (since the last reset), as a row of their own."""
    return Snapshot("peak (generation)", rss=done.rss_peak, cuda_allocated=done.cuda_peak,
                    cuda_reserved=done.cuda_peak_reserved)  # fmt: skip


def _torch_cuda() -> DeviceStats:
    import torch

    return torch.cuda

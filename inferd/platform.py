"""Process-level settings for the device inferd runs on."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import torch

from inferd.cpu_info import default_cpu_dtype

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


@functools.cache
def keep_freed_memory_in_heap() -> bool:
    """Stop glibc from returning large freed blocks to the kernel.

    By default every tensor over a few hundred KiB is a fresh mmap, and each first touch of its
    pages is a page fault: on this class of machine that made an 8 MB elementwise op 7x slower
    than the same op on reused memory. A decode step allocates tensors of that size (logits,
    activations) every time, so the engine keeps freed memory in the heap for reuse.
    Returns whether the setting took effect (glibc only).
    """
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30) and libc.mallopt(
            _M_TRIM_THRESHOLD, (1 << 31) - 1
        )
    except (OSError, AttributeError):
        return False
    return bool(ok)


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}  # fmt: skip


def resolve_device(name: str | None) -> torch.device:
    if name is None:
        return default_device()
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto`: bf16 on GPUs that support it (else fp16); on CPU bf16 where the CPU has fast
    bf16 (avx512_bf16/AMX), else float32. Parity with HF is checked in float32."""
    if name != "auto":
        if name not in DTYPES:
            raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {name!r}")
        dtype = DTYPES[name]
        if dtype == torch.float16 and device.type == "cpu":
            raise ValueError("dtype float16 is not supported on CPU; use bfloat16 or float32")
        return dtype
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return DTYPES[default_cpu_dtype()]

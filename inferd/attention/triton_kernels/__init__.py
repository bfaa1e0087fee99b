"""Triton kernels of the paged attention backend (see docs/attention.md).

They run compiled on a GPU, or on CPU tensors under the Triton interpreter
(`TRITON_INTERPRET=1`, set before this package is imported), which is how the tests check them.
"""

from __future__ import annotations

from inferd.attention.triton_kernels.common import Tiles, decode_tiles, prefill_tiles
from inferd.attention.triton_kernels.decode import paged_decode
from inferd.attention.triton_kernels.prefill import paged_prefill
from inferd.attention.triton_kernels.store_kv import store_kv

__all__ = ["Tiles", "decode_tiles", "paged_decode", "paged_prefill", "prefill_tiles", "store_kv"]

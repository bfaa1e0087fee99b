"""KV-cache arithmetic: bytes per token, per block, and how a memory budget becomes block pools.

    KV bytes per token (one layer) = 2 (K and V) × kv_heads × row bytes
    row bytes = head_dim × bytes per element (+ 4 for int8: each row's float32 scale)

summed over layers. A KV dtype is given as its bytes per element (4, 2, 1: float32, 16-bit and
fp8 rows hold nothing else) or as a `KVElement` (int8, whose rows also hold their scale:
inferd/kv_int8.py). A sliding-window layer never holds more than `window` tokens of a sequence,
so at context length L it costs min(L, window) tokens, not L. inferd keeps one block pool per KV
group (layers sharing a window, see `ModelConfig.kv_groups`) so that the sliding layers' memory
really is capped: their blocks are freed once they leave the window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from inferd.config import ModelConfig
from inferd.kv_int8 import INT8_KV, SCALE_BYTES

# Block 0 of every pool is never handed out: padded block tables point at it.
NULL_BLOCKS = 1


@dataclass(frozen=True)
class KVElement:
    """How a KV cache dtype stores one token's key (or value) vector of one KV head:
    `bytes` per value, and `row_extra` bytes per vector besides them."""

    bytes: int
    row_extra: int = 0

    def row_bytes(self, head_dim: int) -> int:
        return head_dim * self.bytes + self.row_extra


INT8_ROWS = KVElement(1, SCALE_BYTES)  # codes, then their float32 scale


def kv_element(kv_dtype: torch.dtype) -> KVElement:
    """The element of a cache tensor's dtype, as the runner allocates it."""
    return INT8_ROWS if kv_dtype == INT8_KV else KVElement(kv_dtype.itemsize)


def _row_bytes(config: ModelConfig, dtype_bytes: int | KVElement) -> int:
    element = dtype_bytes if isinstance(dtype_bytes, KVElement) else KVElement(dtype_bytes)
    return element.row_bytes(config.head_dim)


def kv_bytes_per_token_per_layer(config: ModelConfig, dtype_bytes: int | KVElement) -> int:
    return 2 * config.num_kv_heads * _row_bytes(config, dtype_bytes)


def kv_bytes_per_token(config: ModelConfig, dtype_bytes: int | KVElement) -> int:
    """All layers, as if every layer attended to the whole context (no window cap)."""
    return config.num_layers * kv_bytes_per_token_per_layer(config, dtype_bytes)


def kv_bytes_for_context(config: ModelConfig, context_len: int,
                         dtype_bytes: int | KVElement) -> int:  # fmt: skip
    """One sequence of `context_len` tokens, with sliding layers capped at their window."""
    per_layer = kv_bytes_per_token_per_layer(config, dtype_bytes)
    total = 0
    for layer in range(config.num_layers):
        window = config.layer_window(layer)
        total += per_layer * (context_len if window is None else min(context_len, window))
    return total


def block_bytes(config: ModelConfig, layers: int, block_size: int,
                dtype_bytes: int | KVElement) -> int:  # fmt: skip
    return layers * block_size * kv_bytes_per_token_per_layer(config, dtype_bytes)


def blocks_per_sequence_in_window(window: int, block_size: int, chunk: int) -> int:
    """Most blocks a sequence holds in a sliding group: the window behind the step's first new
    token plus the step's own new tokens, rounded out to whole blocks on both ends."""
    return math.ceil((window - 1 + chunk) / block_size) + 1


@dataclass(frozen=True)
class KVPoolPlan:
    block_size: int
    num_blocks: list[int]  # per KV group, including the null block
    block_bytes: list[int]  # per KV group
    # Tokens of context the full-attention pool holds across all sequences; None when every
    # layer slides, since then a sequence of any length only ever holds its window.
    token_capacity: int | None

    @property
    def total_bytes(self) -> int:
        return sum(n * b for n, b in zip(self.num_blocks, self.block_bytes))


def plan_kv_pool(
    config: ModelConfig,
    budget_bytes: int,
    block_size: int,
    dtype_bytes: int | KVElement,
    max_num_seqs: int,
    max_num_batched_tokens: int,
) -> KVPoolPlan:
    """Split `budget_bytes` between the KV groups.

    Every group gets as many blocks as the full-attention group, except that a sliding group
    never needs more than each running sequence's window (plus one step's chunk): past that cap
    the rest of the budget goes to the groups whose memory grows with context.
    """
    groups = config.kv_groups()
    sizes = [block_bytes(config, len(layers), block_size, dtype_bytes) for _, layers in groups]
    caps = [
        None
        if window is None
        else max_num_seqs * blocks_per_sequence_in_window(window, block_size, 1)
        + blocks_per_sequence_in_window(window, block_size, max_num_batched_tokens)
        + NULL_BLOCKS
        for window, _ in groups
    ]

    def blocks_at(n: int) -> list[int]:
        return [n if cap is None else min(n, cap) for cap in caps]

    def cost(n: int) -> int:
        return sum(b * s for b, s in zip(blocks_at(n), sizes))

    # The largest common block count whose cost fits: cost is monotone in n, so bisect.
    lo, hi = 0, budget_bytes // min(sizes) + 1
    if all(cap is not None for cap in caps):
        hi = min(hi, max(caps))  # nothing grows past the largest cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if cost(mid) <= budget_bytes else (lo, mid - 1)
    num_blocks = blocks_at(lo)
    full = [nb for nb, (window, _) in zip(num_blocks, groups) if window is None]
    if min(num_blocks) <= NULL_BLOCKS:
        raise ValueError(
            f"kv_cache_memory of {budget_bytes} bytes is too small: one block of {block_size} "
            f"tokens needs {sum(sizes)} bytes across all layers"
        )
    capacity = (min(full) - NULL_BLOCKS) * block_size if full else None
    return KVPoolPlan(block_size, num_blocks, sizes, capacity)

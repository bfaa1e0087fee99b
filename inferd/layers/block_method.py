"""`BlockMethod`: a layer that keeps a GGUF file's blocks and picks its kernel per step.

Steps of at most `max_rows` rows (decode) go to the C block kernel, which reads the file's 4–8
bit blocks (gguf_blocks.py): such steps are bound by reading weights, and the blocks are the
fewest bytes. Larger steps (prefill, big batches) are bound by arithmetic, where PyTorch's GEMM
in `dtype` wins; their weights are either

* a `dtype` copy of the blocks, made at the first step that needs it and kept (`keep_copy`:
  bfloat16 on CPUs with fast bf16 — twice the blocks' memory, none of it spent by workloads
  that never run a large step), or
* dequantised from the blocks anew for every such step, a slab of rows at a time (no memory
  kept; each slab is still in cache when the GEMM reads it, so the step reads the blocks once
  and never holds a float32 matrix: the LM head alone would be 4x the file's size).

Both come from the same integers, so the two paths compute the same model up to the rounding of
activations (16-bit, as two int8 terms per 32 values, in the block kernel).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inferd.layers.gguf_blocks import BlockWeight, stack
from inferd.layers.linear_method import LinearMethod, dropped

# Weights per slab of a dequantising large step: 8 MB in float32, which stays in the L2/L3
# caches between its dequantisation and the GEMM that reads it.
SLAB_WEIGHTS = 2 << 20


class BlockMethod(LinearMethod):
    wants_blocks = True

    def __init__(self, dtype: torch.dtype, max_rows: int, keep_copy: bool):
        super().__init__()
        self.dtype, self.max_rows, self.keep_copy = dtype, max_rows, keep_copy
        self.blocks: BlockWeight | None = None  # None: the checkpoint had no blocks for it
        self._shards: dict[int, tuple] = {}  # (q, scale, offset) per shard, until `finish`
        self.register_buffer("dense_copy", None, persistent=False)

    def take_blocks(self, layer: nn.Module, shard: int, blocks: tuple) -> None:
        self._shards[shard] = blocks

    def finish(self, layer: nn.Module) -> None:
        """One block weight for the whole layer; or, if some shard came dense (not every
        tensor of a GGUF file is quantised), the block shards dequantised into the dense
        matrix, which then serves every step."""
        shards, self._shards = self._shards, {}
        if not shards:
            return
        weights = {i: BlockWeight(*p) for i, p in shards.items()}
        sizes = layer.shard_sizes
        if len(weights) == len(sizes):
            ordered = [weights[i] for i in range(len(sizes))]
            self.install(layer, ordered[0] if len(ordered) == 1 else stack(ordered))
            return
        for shard, weight in weights.items():
            start = sum(sizes[:shard])
            layer.weight.data[start : start + sizes[shard]] = weight.dequantized()

    def install(self, layer: nn.Module, blocks: BlockWeight) -> None:
        """Compute with `blocks` from now on; the layer's dense matrix is dropped."""
        self.blocks = blocks
        layer.weight = dropped(layer.weight)

    def kernel_for(self, rows: int) -> str:
        if self.blocks is None:
            return "gemm"
        if rows <= self.max_rows:
            return "blocks"
        return "gemm-copy" if self.keep_copy else "gemm-dequantised"

    def dense_copy_weight(self) -> torch.Tensor:
        """The kept `dtype` copy of the blocks, made at the first large step."""
        if self.dense_copy is None:
            self.dense_copy = self.blocks.dense(self.dtype)
        return self.dense_copy

    def dequantising_product(self, x: torch.Tensor) -> torch.Tensor:
        """x @ w^T in `dtype`, the weights dequantised a slab of rows at a time."""
        n, k = self.blocks.shape
        x = x.to(self.dtype)
        slab = max(64, SLAB_WEIGHTS // k)
        if slab >= n:
            return F.linear(x, self.blocks.dense(self.dtype)).float()
        y = torch.empty(x.shape[0], n, dtype=torch.float32)
        for start in range(0, n, slab):
            rows = slice(start, min(start + slab, n))
            y[:, rows] = F.linear(x, self.blocks.dense(self.dtype, rows))
        return y

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """float32 out, whichever kernel runs."""
        if self.blocks is None:
            return super().apply(layer, x, bias)
        if x.shape[0] <= self.max_rows:
            y = self.blocks(x)
        elif self.keep_copy:
            y = F.linear(x.to(self.dtype), self.dense_copy_weight()).float()
        else:
            y = self.dequantising_product(x)
        return y if bias is None else y + bias

    def lookup(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        if self.blocks is None:
            return super().lookup(layer, ids)
        return self.blocks.dequantized(ids)

    def extra_repr(self) -> str:
        large = f"{self.dtype} copy" if self.keep_copy else f"slabs dequantised to {self.dtype}"
        return f"blocks up to {self.max_rows} rows, then GEMM on a {large}"

"""`BlockMethod`: a layer that keeps a GGUF file's blocks and multiplies by them with the C block
kernel at every step size.

The kernel reads the file's 4–8 bit blocks (gguf_blocks.py), rounds each activation to two int8
terms per 32 values and sums exactly in integers. NOTE: each output's sum is its own chain of
integer and float operations in a fixed order, so a row gets the same bits whatever other rows
share the step: one numeric definition for decode, prefill, big batches and speculative
verification alike (docs/performance.md). No dense copy of the weights is ever made.
"""

from __future__ import annotations

import torch
from torch import nn

from inferd.layers.gguf_blocks import BlockWeight, stack
from inferd.layers.linear_method import LinearMethod, dropped


class BlockMethod(LinearMethod):
    wants_blocks = True

    def __init__(self):
        super().__init__()
        self.blocks: BlockWeight | None = None  # None: the checkpoint had no blocks for it
        self._shards: dict[int, BlockWeight] = {}  # packed, per shard, until `finish`
        # GPTQ act-order: the blocks' input order (their groups contiguous); the layer's input
        # columns are gathered in it before the product. None: the inputs' own order.
        self.input_order: torch.Tensor | None = None

    def take_input_order(self, order: torch.Tensor | None) -> None:
        """Every shard of a layer reads the same input, so they must share one order."""
        if self._shards and not _same_order(self.input_order, order):
            raise ValueError("its parts (q/k/v or gate/up) sort their inputs in different "
                             "act-order permutations; inferd needs them equal")  # fmt: skip
        self.input_order = order

    def take_blocks(self, layer: nn.Module, shard: int, blocks: BlockWeight) -> None:
        """A shard's blocks, packed as they arrive: what a load holds until `finish` is the
        packed weights (about the file's size), not their unpacked integers."""
        self._shards[shard] = blocks
        if len(self._shards) == len(layer.shard_sizes):
            # NOTE: finished as soon as the layer is whole (not when the whole model is), so
            # that a first load can write its blocks to the weight cache and drop them
            self.finish(layer)

    def finish(self, layer: nn.Module) -> None:
        """One block weight for the whole layer; or, if some shard came dense (not every
        tensor of a GGUF file is quantised), the block shards dequantised into the dense
        matrix, which then serves every step."""
        shards, self._shards = self._shards, {}
        if not shards:
            return
        sizes = layer.shard_sizes
        if len(shards) == len(sizes):
            ordered = [shards[i] for i in range(len(sizes))]
            self.install(layer, ordered[0] if len(ordered) == 1 else stack(ordered))
            return
        order, self.input_order = self.input_order, None  # the dense matrix: inputs in order
        for shard, weight in shards.items():
            start = sum(sizes[:shard])
            rows = weight.dequantized()
            if order is not None:
                rows = rows[:, torch.argsort(order)]
            layer.weight.data[start : start + sizes[shard]] = rows

    def install(self, layer: nn.Module, blocks: BlockWeight) -> None:
        """Compute with `blocks` from now on; the layer's dense matrix is dropped."""
        self.blocks = blocks
        layer.weight = dropped(layer.weight)

    def kernel_for(self, rows: int) -> str:
        return "gemm" if self.blocks is None else "blocks"

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """float32 out."""
        if self.blocks is None:
            return super().apply(layer, x, bias)
        if self.input_order is not None:
            x = x.index_select(-1, self.input_order)
        y = self.blocks(x)
        return y if bias is None else y + bias

    def lookup(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        if self.blocks is None:
            return super().lookup(layer, ids)
        rows = self.blocks.dequantized(ids)
        if self.input_order is not None:
            return rows[..., torch.argsort(self.input_order)]
        return rows

    def extra_repr(self) -> str:
        return "GGUF blocks, the C block kernel at every step size"


def _same_order(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))

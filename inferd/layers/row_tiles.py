"""Dense weights multiplied in fixed-shape row tiles: `--deterministic` on CPU.

PyTorch's GEMM picks its kernel, blocking and summation order by the shape of the call, so the
same row can get different bits in a step of 1 row and in a step of 300 (the dense modes are
not batch-invariant by default: docs/performance.md). Here every call has the same shape,
`TILE_ROWS` rows (the last tile zero-padded), so a row's result depends on its tile position
only if the kernel treats positions differently; `finish` checks once per matrix that it does
not (random rows, permuted within the tile: the same bits), and falls back to one row per call
where it does. A tile of many rows costs a step of few rows more (a decode step of one sequence
computes a whole tile), which is the price of the flag.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from inferd.layers.linear_method import LinearMethod

log = logging.getLogger(__name__)

TILE_ROWS = 16


def row_position_independent(weight: torch.Tensor, tile: int, seed: int = 0) -> bool:
    """Whether F.linear on [tile, in] rows gives each row the same bits at every position of
    the tile (random rows, several permutations)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tile, weight.shape[1], generator=gen).to(weight.dtype)
    y = F.linear(x, weight)
    for _ in range(2):
        perm = torch.randperm(tile, generator=gen)
        if not torch.equal(F.linear(x[perm], weight), y[perm]):
            return False
    return True


class RowTiledMethod(LinearMethod):
    """A dense matrix (the layer's `weight`) multiplied `tile` rows per GEMM call."""

    def __init__(self, tile: int = TILE_ROWS):
        super().__init__()
        self.tile = tile

    def finish(self, layer: nn.Module) -> None:
        weight = layer.weight
        if weight.numel() and not row_position_independent(weight.detach(), self.tile):
            log.warning("PyTorch's GEMM gives a row different bits at different positions of a "
                        "%d-row tile for a %s %s matrix here: --deterministic multiplies it one "
                        "row per call (slower)", self.tile, tuple(weight.shape),
                        weight.dtype)  # fmt: skip
            self.tile = 1

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        w = layer.weight
        x = x if x.dtype == w.dtype else x.to(w.dtype)
        rows, tile = x.shape[0], self.tile
        padded = -(-rows // tile) * tile
        if padded != rows:
            x = torch.cat([x, x.new_zeros(padded - rows, x.shape[1])])
        out = torch.empty(padded, w.shape[0], dtype=w.dtype, device=x.device)
        for start in range(0, padded, tile):
            out[start : start + tile] = F.linear(x[start : start + tile], w, bias)
        return out[:rows]

    def extra_repr(self) -> str:
        return f"dense, {self.tile} rows per GEMM call"

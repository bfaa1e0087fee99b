"""MXFP4 tensors of an HF folder (`quantization_config: {"quant_method": "mxfp4"}`: gpt-oss's
experts) as lazy weights the loader reads as blocks or dense.

The folder stores a quantised tensor X as two: `X_blocks`, uint8 [..., out, in / 32, 16], each
byte two 4-bit e2m1 codes of consecutive inputs (low nibble first), and `X_scales`, uint8 [...,
out, in / 32], each block's E8M0 exponent (scale 2^(e - 127)). Unlike the dense parameter it
stands for (gpt-oss's `gate_up_proj` is [experts, in, out]), the blocks are laid out output by
input. `mxfp4_weights` joins each pair into one `MxFp4Weight` named X; its `load_blocks` gives
the block values inferd's C kernels keep (the same codebook and scales as a GGUF file's MXFP4,
whose blocks pair code j with code j + 16 in a byte instead: the bytes are reordered into that
layout and read by the GGUF reader, gguf_iquants.py), `load` the dequantised matrix.

Nothing is read before a rank asks for an expert's rows: the pairs are views over the folder's
lazy tensors (or their shapes alone, for the loader's checks of the headers).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from inferd.errors import ModelLoadError
from inferd.layers.gguf_blocks import BlockValues
from inferd.loader.gguf_iquants import MXFP4, block_values

BLOCK = 32  # inputs per scale
_SUFFIXES = ("_blocks", "_scales")


def mxfp4_weights(weights: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """The folder's (name, lazy weight) pairs with every `X_blocks` / `X_scales` pair as one
    `MxFp4Weight` named X (once both are seen; any order, any shard); other tensors as they
    are. A half without its other half is a ModelLoadError."""
    halves: dict[str, dict[str, Any]] = {}
    for name, weight in weights:
        stem, suffix = name[:-7], name[-7:]
        if suffix not in _SUFFIXES:
            yield name, weight
            continue
        pair = halves.setdefault(stem, {})
        pair[suffix] = weight
        if len(pair) == 2:
            yield stem, MxFp4Weight(pair["_blocks"], pair["_scales"], stem)
            del halves[stem]
    if halves:
        stem, pair = next(iter(halves.items()))
        lacks = next(s for s in _SUFFIXES if s not in pair)
        raise ModelLoadError(f"MXFP4 tensor {stem}: the checkpoint has no {stem}{lacks}")


class MxFp4Weight:
    """A stacked [..., out, in] MXFP4 tensor, or (`expert`, `every`) one expert's matrix, or
    every `step`-th of its rows from `start` (gpt-oss interleaves gate and up rows)."""

    out_by_in = True  # rows are outputs, as the C kernels and `load` give them

    def __init__(self, blocks: Any, scales: Any, name: str, start: int = 0, step: int = 1):
        self.blocks, self.scales, self.name = blocks, scales, name
        self.start, self.step = start, step
        *lead, out, groups, width = blocks.shape
        if width != BLOCK // 2 or tuple(scales.shape) != (*lead, out, groups):
            raise ModelLoadError(f"MXFP4 tensor {name}: blocks {tuple(blocks.shape)} and scales "
                                 f"{tuple(scales.shape)} are not [..., out, in/32, 16] and "
                                 "[..., out, in/32]")  # fmt: skip
        rows = len(range(start, out, step))
        self.shape = (*lead, rows, groups * BLOCK)

    def expert(self, index: int) -> MxFp4Weight:
        if len(self.shape) != 3:
            raise ValueError(f"{self.name} is not stacked by expert")
        return MxFp4Weight(self.blocks.expert(index), self.scales.expert(index), self.name)

    def every(self, start: int, step: int) -> MxFp4Weight:
        """Rows start, start + step, ... of a 2-D matrix."""
        return MxFp4Weight(self.blocks, self.scales, self.name, start, step)

    def _read(self, rows: tuple[int, int] | None, cols: tuple[int, int] | None):
        """uint8 blocks [n, in/32, 16] and exponents [n, in/32] of the requested rows/columns
        (whole blocks of 32 inputs, else ValueError)."""
        if len(self.shape) != 2:
            raise ValueError(f"{self.name} is stacked: read it one expert at a time")
        first, count = rows if rows is not None else (0, self.shape[0])
        lo = self.start + first * self.step
        span = (lo, (count - 1) * self.step + 1)  # the rows from the first to the last wanted
        groups = None
        if cols is not None:
            if cols[0] % BLOCK or cols[1] % BLOCK:
                raise ValueError(f"columns {cols} of {self.name} cut MXFP4 blocks of {BLOCK}")
            groups = (cols[0] // BLOCK, cols[1] // BLOCK)
        blocks = self.blocks.load(torch.uint8, rows=span, cols=groups)[:: self.step]
        scales = self.scales.load(torch.uint8, rows=span, cols=groups)[:: self.step]
        return blocks, scales

    def load_blocks(self, rows=None, cols=None) -> BlockValues:
        """The rows' block values (q the doubled e2m1 values, scale 2^(e - 128) per 32)."""
        blocks, scales = self._read(rows, cols)
        n, groups = scales.shape
        codes = torch.stack([blocks & 0xF, blocks >> 4], dim=-1).view(n, groups, BLOCK)
        # GGML's MXFP4 block: the exponent, then byte j = code j | code j + 16 << 4
        ggml = torch.cat([scales.unsqueeze(-1), codes[..., :16] | (codes[..., 16:] << 4)], -1)
        return block_values(ggml.view(n * groups, 17), MXFP4, n, groups * BLOCK)

    def load(self, dtype: torch.dtype, rows=None, cols=None) -> torch.Tensor:
        """The dequantised rows [n, in] (every value q * 2^(e - 128) exactly, as HF's)."""
        values = self.load_blocks(rows, cols)
        scale = values.scale.repeat_interleave(BLOCK, dim=1)
        return (values.q.float() * scale).to(dtype)

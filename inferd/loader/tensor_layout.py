"""Checkpoint tensors → the names and layout inferd's modules load, for every family alike.

Checkpoints of one model spell its tensors several ways; this module turns each spelling into
one: HF names, one 2-D matrix per projection and per expert.

* the family's own spellings (`Architecture.renames`: Mixtral's `block_sparse_moe.experts.N.w1`
  is `mlp.experts.N.gate_proj`);
* fused tensors (`Architecture.fused`: Phi-3's `qkv_proj` is q, k and v stacked) are split into
  their parts by rows;
* experts stacked in one 3-D tensor, transformers 5's `mlp.experts.gate_up_proj` [experts,
  2 x inter, hidden] and `mlp.experts.down_proj` [experts, hidden, inter], or GGUF's
  `ffn_{gate,up,down}_exps` [experts, rows, cols], become `mlp.experts.E.{gate,up,down}_proj`.

* a gate vector stored 1-D (llama.cpp's files hold Qwen2-MoE's `ffn_gate_inp_shexp` as [hidden]
  or [1, hidden]) is read as the [1, hidden] matrix the model holds.

Nothing is read: the parts are views (`RowsView`, `weight.expert(e)`) that read only their
rows when loaded, so a tensor-parallel rank or an expert-parallel rank still reads only what it
keeps. The same views over shapes alone (`ShapeOnly`) let the loader check a checkpoint's
headers against its config before anything is allocated.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from inferd.config import ModelConfig
from inferd.loader.hf_mxfp4 import mxfp4_weights
from inferd.models.architecture import Architecture

_LAYER = re.compile(r"(model\.layers\.\d+\.)(.+)\.(weight|bias)$")
_PACKED = re.compile(r"(model\.layers\.\d+\.mlp\.experts\.)(gate_up_proj|down_proj)$")
_STACKED = re.compile(r"(model\.layers\.\d+\.mlp\.experts\.)(gate_proj|up_proj|down_proj)\.weight$")


class ShapeOnly:
    """A tensor known only by its shape (a safetensors header entry)."""

    def __init__(self, shape: tuple[int, ...]):
        self.shape = tuple(shape)

    def expert(self, index: int) -> ShapeOnly:
        return ShapeOnly(self.shape[1:])


class RowsView:
    """Rows [start, start + count) of a 2-D lazy weight, itself a lazy weight: `load` and
    `load_blocks` take rows relative to the view, as a tensor-parallel rank asks for them."""

    def __init__(self, base: Any, start: int, count: int):
        self.base, self.start, self.count = base, start, count
        self.shape = (count, *base.shape[1:])

    def _rows(self, rows: tuple[int, int] | None) -> tuple[int, int]:
        return (self.start, self.count) if rows is None else (self.start + rows[0], rows[1])

    def load(self, dtype, rows=None, cols=None):
        return self.base.load(dtype, rows=self._rows(rows), cols=cols)

    @property
    def input_order(self):
        """The base's input order (GPTQ act-order), which a row range shares."""
        return getattr(self.base, "input_order", None)

    def load_blocks(self, rows=None, cols=None):
        load_blocks = getattr(self.base, "load_blocks", None)
        return None if load_blocks is None else load_blocks(self._rows(rows), cols)


class AsRow:
    """A 1-D lazy weight [n] read as a [1, n] matrix."""

    def __init__(self, base: Any):
        self.base, self.shape = base, (1, *base.shape)

    def load(self, dtype, rows=None, cols=None):
        return self.base.load(dtype).view(1, -1)


_ROW_MATRICES = ("mlp.shared_expert_gate.weight",)


def _split(prefix: str, leaf: str, weight: Any, parts) -> Iterator[tuple[str, Any]]:
    start = 0
    for part, rows in parts:
        yield f"{prefix}{part}.{leaf}", RowsView(weight, start, rows)
        start += rows


def _experts(name: str, weight: Any) -> Iterator[tuple[str, Any]] | None:
    """One expert's matrices at a time, from a 3-D stacked tensor; None for other names."""
    if len(weight.shape) != 3:
        return None
    if m := _PACKED.match(name):
        prefix, kind = m.groups()
        if kind == "down_proj":
            parts = lambda e: [(f"{prefix}{e}.down_proj.weight", weight.expert(e))]  # noqa: E731
        else:
            inter = weight.shape[1] // 2

            def parts(e):
                one = weight.expert(e)
                return [(f"{prefix}{e}.gate_proj.weight", RowsView(one, 0, inter)),
                        (f"{prefix}{e}.up_proj.weight", RowsView(one, inter, inter))]  # fmt: skip
    elif m := _STACKED.match(name):
        prefix, kind = m.groups()
        parts = lambda e: [(f"{prefix}{e}.{kind}.weight", weight.expert(e))]  # noqa: E731
    else:
        return None
    return (pair for e in range(weight.shape[0]) for pair in parts(e))


def normalized(
    weights: Iterable[tuple[str, Any]], record: Architecture, config: ModelConfig
) -> Iterator[tuple[str, Any]]:
    """(name, lazy weight) pairs as inferd's modules load them (see the module docstring)."""
    # MXFP4 tensors (`X_blocks` + `X_scales`: gpt-oss's HF experts) as one weight X each, then
    # the family's own layout (gpt-oss's packed experts)
    weights = mxfp4_weights(weights)
    if record.tensor_layout is not None:
        weights = record.tensor_layout(weights, config)
    for name, weight in weights:
        for old, new in record.renames:
            name = name.replace(old, new)
        experts = _experts(name, weight)
        if experts is not None:
            yield from experts
            continue
        m = _LAYER.match(name)
        if m is not None and m.group(2) in record.fused and len(weight.shape) == 2:
            prefix, sub, leaf = m.groups()
            yield from _split(prefix, leaf, weight, record.fused[sub](config))
            continue
        if len(weight.shape) == 1 and name.endswith(_ROW_MATRICES):
            weight = AsRow(weight)
        yield name, weight


def normalized_shapes(
    shapes: dict[str, tuple[int, ...]], record: Architecture, config: ModelConfig
) -> dict[str, tuple[int, ...]]:
    """`normalized` over shapes alone: name → shape as the modules would load them."""
    pairs = normalized(((n, ShapeOnly(s)) for n, s in shapes.items()), record, config)
    return {name: tuple(weight.shape) for name, weight in pairs}

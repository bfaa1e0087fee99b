"""Linear layers, plain or tensor-parallel.

A `Linear` may hold several logical matrices stacked along its output (q/k/v, or gate/up): one
matmul instead of several is fewer kernel launches per token, which dominates decode on small
models. Checkpoints store them separately; `load_shard` puts each into its rows, reading only
the part of the checkpoint tensor this rank keeps:

* column-parallel (`row_ranges`): each logical matrix contributes the checkpoint rows (output
  features) of this rank's heads or MLP slice; no communication in forward;
* row-parallel (`col_range`): this rank keeps a slice of the input features, and the partial
  products of all ranks are summed by an all-reduce.

How the weight is stored and multiplied (dense, a GGUF file's blocks, int8, ...) is the layer's
`quant_method`, given by the model's WeightScheme (weight_scheme.py) at construction.
"""

from __future__ import annotations

import torch
from torch import nn

from inferd.distributed.state import SINGLE, TPGroup
from inferd.layers.gguf_blocks import packed
from inferd.layers.weight_scheme import WeightScheme, as_scheme


class Linear(nn.Module):
    def __init__(
        self,
        in_features: int,
        out_features: int | list[int],
        bias: bool = False,
        scheme: WeightScheme | torch.dtype = torch.float32,
        *,
        row_ranges: list[tuple[int, int]] | None = None,
        col_range: tuple[int, int] | None = None,
        tp: TPGroup = SINGLE,
    ):
        """`out_features`: the full size of each logical matrix. `row_ranges`: per logical
        matrix, the (start, count) of checkpoint rows this rank keeps (default: all).
        `col_range`: the (start, count) of input features this rank keeps (row-parallel).
        `scheme`: the model's weight scheme (a dtype: dense weights in it)."""
        super().__init__()
        scheme = as_scheme(scheme)
        dtype = scheme.dtype
        full = out_features if isinstance(out_features, list) else [out_features]
        self.row_ranges = row_ranges or [(0, n) for n in full]
        self.shard_sizes = [n for _, n in self.row_ranges]
        self.col_range = col_range
        self.tp = tp
        self.in_features = col_range[1] if col_range else in_features
        self.out_features = sum(self.shard_sizes)
        self.weight = nn.Parameter(
            torch.empty(self.out_features, self.in_features, dtype=dtype), requires_grad=False
        )
        self.bias = (
            nn.Parameter(torch.zeros(self.out_features, dtype=dtype), requires_grad=False)
            if bias
            else None
        )
        self.quant_method = scheme.linear_method("linear")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.quant_method.apply(self, x, self.bias)
        if self.col_range is not None:
            y = self.tp.all_reduce(y)  # NOTE: row-parallel layers here have no bias
        return y

    def load_shard(self, param_name: str, weight, shard: int = 0) -> None:
        """Copy this rank's part of one logical matrix (or bias) of the checkpoint (a lazy
        weight: only the needed rows/columns are read) into its rows of the parameter."""
        target = self.weight if param_name == "weight" else self.bias
        if target is None:
            raise ValueError(f"checkpoint has a {param_name} for a layer without one")
        rows = self.row_ranges[shard]
        cols = self.col_range if param_name == "weight" else None
        if param_name == "weight" and hasattr(weight, "load_fp8") and \
                hasattr(self.quant_method, "take_fp8"):  # fmt: skip
            self.quant_method.take_fp8(self, shard, *weight.load_fp8(rows, cols))
            return
        if param_name == "weight" and self.quant_method.wants_blocks:
            load_blocks = getattr(weight, "load_blocks", None)  # GGUF weights have blocks
            if load_blocks is not None:
                start, count = rows

                def load(first: int, n: int):
                    return load_blocks((start + first, n), cols)

                blocks = packed(load, count, self.in_features)
                if blocks is not None:
                    expected = (self.shard_sizes[shard], self.in_features)
                    if tuple(blocks.shape) != expected:
                        raise ValueError(f"shape mismatch: checkpoint {tuple(blocks.shape)} vs "
                                         f"{expected}")  # fmt: skip
                    # GPTQ act-order: the layer reads its inputs in the groups' order
                    self.quant_method.take_input_order(getattr(weight, "input_order", None))
                    self.quant_method.take_blocks(self, shard, blocks)
                    return
        tensor = weight.load(target.dtype, rows=rows, cols=cols)
        start = sum(self.shard_sizes[:shard])
        dest = target[start : start + self.shard_sizes[shard]]
        if dest.shape != tensor.shape:
            raise ValueError(
                f"shape mismatch: checkpoint {tuple(tensor.shape)} vs {tuple(dest.shape)}"
            )
        dest.copy_(tensor)

    def finish_loading(self) -> None:
        """After every shard is loaded: the method converts the weights to its format."""
        self.quant_method.finish(self)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.shard_sizes}, bias={self.bias is not None}"

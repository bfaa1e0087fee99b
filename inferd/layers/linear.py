"""Linear layers. A `Linear` may hold several logical matrices stacked along its output
(q/k/v, or gate/up): one matmul instead of several is fewer kernel launches per token, which
dominates decode on small models. Checkpoints still store them separately; `load_shard` puts each
into its rows."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    def __init__(
        self,
        in_features: int,
        out_features: int | list[int],
        bias: bool = False,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.shard_sizes = out_features if isinstance(out_features, list) else [out_features]
        self.in_features, self.out_features = in_features, sum(self.shard_sizes)
        self.weight = nn.Parameter(
            torch.empty(self.out_features, in_features, dtype=dtype), requires_grad=False
        )
        self.bias = (
            nn.Parameter(torch.zeros(self.out_features, dtype=dtype), requires_grad=False)
            if bias
            else None
        )
        # Set by weight-only quantisation: an integer kernel for steps with few rows.
        self.small_step = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.small_step is not None and x.shape[0] <= self.small_step.max_rows:
            y = self.small_step(x)
            return y if self.bias is None else y + self.bias
        return F.linear(x, self.weight, self.bias)

    def load_shard(self, param_name: str, tensor: torch.Tensor, shard: int = 0) -> None:
        """Copy one logical matrix (or bias) into its rows of `weight` (or `bias`)."""
        target = self.weight if param_name == "weight" else self.bias
        if target is None:
            raise ValueError(f"checkpoint has a {param_name} for a layer without one")
        start = sum(self.shard_sizes[:shard])
        rows = target[start : start + self.shard_sizes[shard]]
        if rows.shape != tensor.shape:
            raise ValueError(f"shape mismatch: checkpoint {tuple(tensor.shape)} vs {tuple(rows.shape)}")
        rows.copy_(tensor)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.shard_sizes}, bias={self.bias is not None}"

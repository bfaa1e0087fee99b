"""`Fp8CheckpointMethod`: a linear layer whose weights a checkpoint stores in FP8 (e4m3, with a
float32 scale per output row or per tensor: compressed-tensors), kept as those bytes and
multiplied by inferd's FP8 C kernel (fp8_weight.py) at every step size; no dense copy.

The checkpoint also says how its activations were quantised when it was calibrated, and that
is what it computes: a static scale (`input_scale`) or a per-token one, each activation row
rounded to e4m3 at that scale before the product (on a CPU this costs one pass over the rows).
"""

from __future__ import annotations

import torch
from torch import nn

from inferd.layers.linear_method import LinearMethod, dropped

FP8_MAX = 448.0  # the largest finite e4m3 value


def fp8_rounded(x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """x rounded to the e4m3 grid at `scale` (clamped to its range), back in float32."""
    q = (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.float() * scale


class Fp8CheckpointMethod(LinearMethod):
    def __init__(self, activations: str | None = None):
        """`activations`: the checkpoint's activation scheme as QuantFormat names it (None:
        activations stay float32, W8A16)."""
        super().__init__()
        self.dynamic = activations is not None and "dynamic" in activations
        self.fp8 = None  # an Fp8Weight; None: the layer came dense (an ignored module)
        self.input_scale: float | None = None
        self._shards: dict[int, tuple[torch.Tensor, torch.Tensor, float | None]] = {}

    def take_fp8(self, layer: nn.Module, shard: int, codes: torch.Tensor, scale: torch.Tensor,
                 input_scale: float | None) -> None:  # fmt: skip
        from inferd.layers.fp8_weight import Fp8Weight  # builds the C kernels on first use

        self._shards[shard] = (codes, scale, input_scale)
        if len(self._shards) == len(layer.shard_sizes):
            shards, self._shards = self._shards, {}
            parts = [shards[i] for i in range(len(shards))]
            self.fp8 = Fp8Weight(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
            # NOTE: q, k and v (gate and up) read the same input; a checkpoint calibrates each
            # its own static scale, and the largest keeps every one of them in range.
            scales = [p[2] for p in parts if p[2] is not None]
            self.input_scale = max(scales) if scales else None
            layer.weight = dropped(layer.weight)

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        if self.fp8 is None:
            return super().apply(layer, x, bias)
        x = x.float()
        if self.input_scale is not None:
            x = fp8_rounded(x, self.input_scale)
        elif self.dynamic:
            row_max = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-12)
            x = fp8_rounded(x, row_max / FP8_MAX)
        y = self.fp8(x.contiguous())
        return y if bias is None else y + bias

    def lookup(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return super().lookup(layer, ids) if self.fp8 is None else self.fp8.dequantized(ids)

    def extra_repr(self) -> str:
        return "the checkpoint's FP8 weights, inferd's FP8 C kernel at every step size"

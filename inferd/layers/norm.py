"""RMSNorm in the two conventions checkpoints use, computed in float32 as HF transformers does."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """y = x / rms(x) * w  (Llama, Qwen), or  x / rms(x) * (1 + w)  with `unit_offset` (Gemma).

    The two differ in where they round: Llama-style multiplies the weight after casting back to
    the input dtype, Gemma-style before. Both are kept exactly, so low-precision runs match HF.
    `F.rms_norm` over float32 input gives the same bits as the written-out formula in one op.
    """

    def __init__(self, dim: int, eps: float, unit_offset: bool = False, dtype=None,
                 out_dtype: torch.dtype | None = None):  # fmt: skip
        super().__init__()
        self.dim, self.eps, self.unit_offset = dim, eps, unit_offset
        # None: the weights' dtype (the input of a matmul); float32 for the residual stream.
        self.out_dtype = out_dtype
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)
        self._gain: torch.Tensor | None = None  # float32 (1 + w), set by `finalize`

    def finalize(self) -> None:
        """Precompute the float32 gain once the weights are loaded (same bits as per call)."""
        self._gain = (1.0 + self.weight.float()) if self.unit_offset else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.out_dtype or self.weight.dtype
        x32 = x if x.dtype == torch.float32 else x.float()
        if self.unit_offset:
            gain = self._gain if self._gain is not None else 1.0 + self.weight.float()
            y = F.rms_norm(x32, (self.dim,), gain, self.eps)
            return y if out == torch.float32 else y.to(out)
        if self.weight.dtype == torch.float32:
            return F.rms_norm(x32, (self.dim,), self.weight, self.eps).to(out)
        y = self.weight * F.rms_norm(x32, (self.dim,), None, self.eps).to(self.weight.dtype)
        return y.to(out)


def stacked_gain(norms: list[tuple[RMSNorm, int]]) -> torch.Tensor | None:
    """One [sum(heads), dim] float32 gain for several per-head norms applied as one (q and k
    norms over the heads of a fused projection). None unless all use the (1 + w) form."""
    if not all(n.unit_offset for n, _ in norms):
        return None
    return torch.cat([(1.0 + n.weight.float()).expand(heads, -1) for n, heads in norms])

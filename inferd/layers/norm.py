"""RMSNorm in the two conventions checkpoints use, computed in float32 as HF transformers does."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """y = x / rms(x) * w  (Llama, Qwen), or  x / rms(x) * (1 + w)  with `unit_offset` (Gemma).

    The two differ in where they round: Llama-style multiplies the weight after casting back to
    the input dtype, Gemma-style before. Both are kept exactly, so low-precision runs match HF.
    """

    def __init__(self, dim: int, eps: float, unit_offset: bool = False, dtype=None):
        super().__init__()
        self.eps, self.unit_offset = eps, unit_offset
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)
        self._gain: torch.Tensor | None = None  # float32 (1 + w), set by `finalize`

    def finalize(self) -> None:
        """Precompute the float32 gain once the weights are loaded (same bits as per call)."""
        if self.unit_offset:
            self._gain = 1.0 + self.weight.float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.unit_offset:
            gain = self._gain if self._gain is not None else 1.0 + self.weight.float()
            return (x32 * gain).to(x.dtype)
        return self.weight * x32.to(x.dtype)

"""fp8 (e4m3) facts shared by the quantised layers and the fp8 KV cache: one module that both
`inferd.layers` and `inferd.attention` import, so neither package imports the other for them."""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3 value


def saturate_to_fp8(x: torch.Tensor) -> torch.Tensor:
    """`x` in e4m3, values beyond ±448 clamped to ±448 (a plain cast would give NaN)."""
    return x.float().clamp(-FP8_MAX, FP8_MAX).to(FP8)

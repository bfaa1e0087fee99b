"""Weight-only quantisation (`--quantization int8 | int4`) for linear layers and the LM head.

A decode step with a few sequences multiplies a handful of activation rows by every weight: it
is bound by how many weight bytes it reads, so 8- or 4-bit weights make it faster. A step with
many rows (prefill, large batches) is bound by arithmetic, where PyTorch's bf16 GEMM beats the
weight-only kernels by 2-3x. So a quantised layer keeps two forms of the *same* weights: the
packed integers for small steps, and their exact bf16 dequantisation for large ones. Measured
on this project's 2-core AVX-512 CPU (ms, torch 2.13):

    matrix            rows  bf16  int8  int4        matrix           rows  bf16  int8  int4
    4096 x 640 (MLP)     1  0.13  0.07  0.08        262144 x 640 (LM    1    21    13   4.8
                         4  0.18  0.16  0.14        head)               8    52    68    38
                         8  0.20  0.29  0.25                           16    65   144    68

hence the row limits below. int8 is symmetric per output channel; int4 is asymmetric in groups
of 32 input channels (the layout `_weight_int4pack_mm_for_cpu` consumes).
"""

from __future__ import annotations

import torch
from torch import nn

INT4_GROUP = 32
QUANTIZATION_METHODS = ("int8", "int4")
# Largest step (rows) for which the integer kernel beats bf16 GEMM, per kind of matrix.
ROW_LIMITS = {("int8", "linear"): 4, ("int4", "linear"): 4, ("int8", "head"): 2, ("int4", "head"): 8}

class Int8Kernel(nn.Module):
    """Symmetric per-output-channel int8 weights: w ≈ q * scale."""

    def __init__(self, w: torch.Tensor, max_rows: int):
        super().__init__()
        w = w.float()
        scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).to(torch.bfloat16)
        self.register_buffer("q", torch.round(w / scales.float()[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scales)
        self.max_rows = max_rows

    def dequantized(self) -> torch.Tensor:
        return (self.q.float() * self.scales.float()[:, None]).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x, self.q, self.scales)


class Int4Kernel(nn.Module):
    """Asymmetric 4-bit groups along the input: w ≈ (q - 8) * scale + zero, q in [0, 15]."""

    def __init__(self, w: torch.Tensor, max_rows: int, group: int = INT4_GROUP):
        super().__init__()
        out_features, in_features = w.shape
        if in_features % group or out_features % 16:
            raise ValueError(
                f"int4 needs input features divisible by {group} and output features by 16, "
                f"got a {out_features} x {in_features} matrix"
            )
        g = w.float().view(out_features, in_features // group, group)
        lo, hi = g.amin(dim=-1), g.amax(dim=-1)
        scale = ((hi - lo) / 15).clamp(min=1e-8).to(torch.bfloat16).float()
        q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15)
        zero = (lo + 8 * scale).to(torch.bfloat16).float()
        self._dequant = ((q - 8) * scale[..., None] + zero[..., None]).view(w.shape)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            q.to(torch.int32).view(out_features, in_features), 1
        )
        self.register_buffer("packed", packed)
        sz = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()
        self.register_buffer("scales_zeros", sz.to(torch.bfloat16))
        self.group, self.max_rows = group, max_rows

    def dequantized(self) -> torch.Tensor:
        out, self._dequant = self._dequant.to(torch.bfloat16), None  # needed once, at load
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, self.packed, self.group, self.scales_zeros
        )


def check_quantization(method: str, device: torch.device) -> None:
    if method not in QUANTIZATION_METHODS:
        raise ValueError(
            f"quantization must be one of {', '.join(QUANTIZATION_METHODS)}, got {method!r}"
        )
    if device.type != "cpu":
        raise ValueError(f"--quantization {method} uses CPU kernels; it is not available on {device}")


KERNELS = {"int8": Int8Kernel, "int4": Int4Kernel}


def quantize_model(model: torch.nn.Module, method: str) -> None:
    """Quantise every Linear and the LM head of a loaded bf16 model in place. Each keeps its
    integer kernel as `small_step` (used for steps of at most `max_rows` rows) and, as its
    weight, the exact bf16 dequantisation of the same integers (used for larger steps)."""
    from inferd.layers.embedding import LMHead
    from inferd.layers.linear import Linear

    kernel_cls = KERNELS[method]
    for module in list(model.modules()):
        if isinstance(module, Linear):
            kernel = kernel_cls(module.weight.data, ROW_LIMITS[(method, "linear")])
            module.weight.data = kernel.dequantized()
            module.small_step = kernel
        elif isinstance(module, LMHead):
            kernel = kernel_cls(module.weight.data, ROW_LIMITS[(method, "head")])
            # The head gets its own matrix: the (tied) embedding keeps the original values.
            module.weight = nn.Parameter(kernel.dequantized(), requires_grad=False)
            module.small_step = kernel

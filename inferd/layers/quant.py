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

from collections.abc import Callable

import torch

INT4_GROUP = 32
QUANTIZATION_METHODS = ("int8", "int4")
# Largest step (rows) for which the integer kernel beats bf16 GEMM, per kind of matrix.
ROW_LIMITS = {("int8", "linear"): 4, ("int4", "linear"): 4, ("int8", "head"): 2, ("int4", "head"): 8}

Kernel = Callable[[torch.Tensor], torch.Tensor]


def quantize_int8(w: torch.Tensor) -> tuple[Kernel, torch.Tensor]:
    """(kernel for small steps, bf16 dequantised weight) of a [out, in] matrix."""
    w = w.float()
    scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).to(torch.bfloat16)
    q = torch.round(w / scales.float()[:, None]).clamp(-127, 127).to(torch.int8)
    dequant = (q.float() * scales.float()[:, None]).to(torch.bfloat16)

    def kernel(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x, q, scales)

    return kernel, dequant


def quantize_int4(w: torch.Tensor, group: int = INT4_GROUP) -> tuple[Kernel, torch.Tensor]:
    """Asymmetric 4-bit groups: w ≈ (q - 8) * scale + zero, q in [0, 15]."""
    out_features, in_features = w.shape
    if in_features % group:
        raise ValueError(f"int4 needs input features divisible by {group}, got {in_features}")
    g = w.float().view(out_features, in_features // group, group)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    scale = ((hi - lo) / 15).clamp(min=1e-8).to(torch.bfloat16).float()
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15)
    zero = (lo + 8 * scale).to(torch.bfloat16).float()
    dequant = ((q - 8) * scale[..., None] + zero[..., None]).view(out_features, in_features)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
        q.to(torch.int32).view(out_features, in_features), 1
    )
    scales_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()
    scales_zeros = scales_zeros.to(torch.bfloat16)

    def kernel(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, scales_zeros)

    return kernel, dequant.to(torch.bfloat16)


def check_quantization(method: str, device: torch.device) -> None:
    if method not in QUANTIZATION_METHODS:
        raise ValueError(
            f"quantization must be one of {', '.join(QUANTIZATION_METHODS)}, got {method!r}"
        )
    if device.type != "cpu":
        raise ValueError(f"--quantization {method} uses CPU kernels; it is not available on {device}")


def quantize(w: torch.Tensor, method: str) -> tuple[Kernel, torch.Tensor]:
    if method == "int8":
        return quantize_int8(w)
    if method == "int4":
        return quantize_int4(w)
    raise ValueError(
        f"quantization must be one of {', '.join(QUANTIZATION_METHODS)}, got {method!r}"
    )


class SmallStepKernel:
    """Run `kernel` for steps of at most `max_rows` rows; larger ones use the bf16 matrix."""

    def __init__(self, kernel: Kernel, max_rows: int):
        self.kernel, self.max_rows = kernel, max_rows

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        if x.shape[0] <= self.max_rows:
            return self.kernel(x)
        return None


def quantize_model(model: torch.nn.Module, method: str) -> None:
    """Quantise every Linear and the LM head of a loaded bf16 model in place."""
    from inferd.layers.embedding import LMHead
    from inferd.layers.linear import Linear

    for module in model.modules():
        if isinstance(module, Linear):
            kernel, dequant = quantize(module.weight.data, method)
            module.weight.data = dequant
            module.small_step = SmallStepKernel(kernel, ROW_LIMITS[(method, "linear")])
        elif isinstance(module, LMHead):
            kernel, dequant = quantize(module.weight.data, method)
            # The head gets its own matrix: the (tied) embedding keeps the original values.
            module.weight = torch.nn.Parameter(dequant, requires_grad=False)
            module.small_step = SmallStepKernel(kernel, ROW_LIMITS[(method, "head")])

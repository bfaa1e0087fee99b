"""Quantised linear layers and LM head: `--quantization int8 | int4`.

int8 (W8A8): weights in int8 with one scale per output channel, and each step's activations
quantised to int8 per row on the fly; the product is an integer matmul (`torch._int_mm`, VNNI on
this CPU) with exact int32 sums. Measured here (ms, torch 2.13) it beats every alternative at
every batch size, so it serves all steps:

    matrix                rows   bf16   int8 weight-only   int8 W8A8   int4 weight-only
    262144 x 640 LM head     1     21         13              9.7            4.8
                            16     50         77               21             68
    4096 x 640 MLP           1   0.13       0.075            0.053          0.077
                            16   0.30        0.58            0.27            0.50

int4 (weight-only): asymmetric 4-bit groups of 32 input channels (the layout
`_weight_int4pack_mm_for_cpu` reads). Fastest for single-sequence decode, which is bound by
reading weights, but slow once a step has many rows, where bf16 GEMM is compute-bound and 2-3x
faster. So an int4 layer keeps two forms of the *same* weights: the packed integers for steps of
at most `ROW_LIMITS` rows, and their exact bf16 dequantisation for larger steps.

Accuracy against bf16 is measured by `tests/parity/test_quantization_accuracy.py` and reported
in docs/performance.md.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

log = logging.getLogger(__name__)

INT4_GROUP = 32
QUANTIZATION_METHODS = ("gguf", "int8", "int4", "fp8")
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3 value
# Largest step (rows) for which the int4 kernel beats bf16 GEMM, per kind of matrix.
ROW_LIMITS = {("int4", "linear"): 4, ("int4", "head"): 8}


class Int8Kernel(nn.Module):
    """int8 weights (symmetric, one scale per output channel) times int8 activations (one scale
    per row, computed on the fly): an integer matmul with exact int32 sums (`torch._int_mm`,
    VNNI on this CPU), then both scales. Rows never interact, so results do not depend on what
    else is in the batch; and at every batch size it beats bf16 here (LM head, 16 rows: 21 ms
    vs 50 ms; one row: 9.7 ms vs 23 ms), so no bf16 copy of the weights is kept."""

    def __init__(self, w: torch.Tensor, max_rows: int | None = None):
        super().__init__()
        w = w.float()
        scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)
        q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
        self.register_buffer("q", q)  # [out, in]; _int_mm reads its transpose in place
        self.register_buffer("scales", scales)
        self.max_rows = max_rows if max_rows is not None else 1 << 62

    def dequantized(self) -> torch.Tensor:
        return (self.q.float() * self.scales[:, None]).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x if x.dtype == torch.float32 else x.float()
        amax = x32.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12)
        a = torch.round(x32 * (127 / amax)).to(torch.int8)
        out = torch._int_mm(a, self.q.t()).mul(self.scales)
        return out.mul_(amax / 127)  # float32: int8 mode keeps activations in float32


class Fp8Kernel(nn.Module):
    """fp8 (e4m3) weights with one scale per output channel, times fp8 activations with one
    scale per row: `torch._scaled_mm`, which runs on fp8 tensor cores on Hopper GPUs. On CPU it
    is a slow reference kernel (useful to check accuracy, not for speed)."""

    def __init__(self, w: torch.Tensor):
        super().__init__()
        w = w.float()
        scales = (w.abs().amax(dim=1) / FP8_MAX).clamp(min=1e-12)
        self.register_buffer("q", (w / scales[:, None]).to(FP8))  # [out, in]
        self.register_buffer("scale_b", scales[None, :].contiguous())  # [1, out]
        self.max_rows = 1 << 62

    def dequantized(self) -> torch.Tensor:
        return (self.q.float() * self.scale_b.t()).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        scale_a = x32.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12) / FP8_MAX
        a = (x32 / scale_a).to(FP8)
        out = torch._scaled_mm(a, self.q.t(), scale_a=scale_a, scale_b=self.scale_b,
                               out_dtype=torch.bfloat16)  # fmt: skip
        return out.to(x.dtype)


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
    if method == "fp8":
        if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
            raise ValueError("--quantization fp8 needs fp8 tensor cores (compute capability 8.9+)")
        if device.type == "cpu":
            log.warning("fp8 on CPU runs PyTorch's slow reference kernel: for checking, not speed")
        return
    if device.type != "cpu":
        raise ValueError(
            f"--quantization {method} uses CPU kernels; it is not available on {device}"
        )
    if method == "gguf":
        from inferd.cpu_kernels import KernelsUnavailable, kernel_library

        try:
            kernel_library()
        except KernelsUnavailable as e:
            raise ValueError(
                f"--quantization gguf needs inferd's C kernels, which cannot be "
                f"built here: {e}. Use --quantization int8 instead."
            ) from e


def quantize_model(model: torch.nn.Module, method: str) -> None:
    """Quantise every Linear and the LM head of a loaded bf16 model in place.

    int8: the W8A8 kernel serves every step and the bf16 weights are dropped. int4: the
    integer kernel serves steps of at most `max_rows` rows; larger steps use the exact bf16
    dequantisation of the same integers, kept as the weight."""
    from inferd.layers.embedding import LMHead
    from inferd.layers.linear import Linear
    from inferd.layers.norm import RMSNorm

    for module in list(model.modules()):
        if method == "int8" and isinstance(module, RMSNorm):
            # The int8 kernels quantise float32 activations directly: no bf16 rounding first.
            module.out_dtype = torch.float32
        if not isinstance(module, Linear | LMHead):
            continue
        kind = "head" if isinstance(module, LMHead) else "linear"
        w = module.weight.data
        if method in ("int8", "fp8"):
            kernel = Int8Kernel(w) if method == "int8" else Fp8Kernel(w)
            weight = torch.empty(0, dtype=w.dtype)  # not needed: the kernel takes every step
        else:
            kernel = Int4Kernel(w, ROW_LIMITS[(method, kind)])
            weight = kernel.dequantized()
        # A new Parameter, so the LM head no longer shares the (tied) embedding's matrix.
        module.weight = nn.Parameter(weight, requires_grad=False)
        module.small_step = kernel

"""Re-quantised linear layers and LM head: `--quantization int8 | int4 | fp8`.

int8 (W8A8): weights in int8 with one scale per output channel, and each step's activations
quantised to int8 per row on the fly; the product is an integer matmul (`torch._int_mm`, VNNI
where the CPU has it) with exact int32 sums. Measured on a 2-core AVX-512 CPU with VNNI and
avx512_bf16 (ms, torch 2.13, one run) it beats every alternative at every batch size, so it
serves all steps:

    matrix                rows   bf16   int8 weight-only   int8 W8A8   int4 weight-only
    262144 x 640 LM head     1     21         13              9.7            4.8
                            16     50         77               21             68
    4096 x 640 MLP           1   0.13       0.075            0.053          0.077
                            16   0.30        0.58            0.27            0.50

int4 (weight-only): asymmetric 4-bit groups of 32 input channels (the layout
`_weight_int4pack_mm_for_cpu` reads). Fastest for single-sequence decode, which is bound by
reading weights, but slow once a step has many rows, where bf16 GEMM is compute-bound and 2-3x
faster. So an int4 layer keeps two forms of the *same* weights: the packed integers for steps of
at most `INT4_ROW_LIMITS` rows, and their exact bf16 dequantisation for larger steps.

Each kernel is wrapped in a `LinearMethod` (linear_method.py) that a layer of a model loaded
with `--quantization int8 | int4 | fp8` holds: the method quantises the layer's loaded bf16
weights once, in `finish`. Accuracy against float32 is measured by
`tests/parity/test_quantization_accuracy.py` and reported in docs/performance.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inferd.cpu_info import cpu_flags
from inferd.fp8 import FP8, FP8_MAX
from inferd.layers.linear_method import LinearMethod, dropped

INT4_GROUP = 32
# Largest step (rows) for which the int4 kernel beats bf16 GEMM, per kind of matrix.
INT4_ROW_LIMITS = {"linear": 4, "head": 8}


def int8_weight_max(device: torch.device) -> int:
    """Largest int8 weight magnitude `torch._int_mm` sums exactly here. On a CPU without VNNI,
    oneDNN's AVX2 kernel adds 128 to the activations and multiplies pairs of bytes into int16
    (vpmaddubsw), which saturates unless 2 · 255 · |w| fits in int16: |w| ≤ 64, one bit less.
    VNNI (avx512_vnni, avx_vnni, AMX) sums into int32 directly, as GPUs do."""
    if device.type != "cpu" or cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"}:
        return 127
    return 64


class Int8Kernel(nn.Module):
    """int8 weights (symmetric, one scale per output channel) times int8 activations (one scale
    per row, computed on the fly): an integer matmul with exact int32 sums (`torch._int_mm`,
    VNNI on this CPU), then both scales. Rows never interact, so results do not depend on what
    else is in the batch; and at every batch size it beats bf16 here (LM head, 16 rows: 21 ms
    vs 50 ms; one row: 9.7 ms vs 23 ms), so no bf16 copy of the weights is kept.

    On a CPU without VNNI `torch._int_mm` is far slower (2-core AMD EPYC, Zen 3, AVX2 only: the
    LM head 93 ms for one row, 1.2 s for 16; a 4096 x 640 matrix 345 ms for 256 rows), so there
    steps of several rows take the same integer sums from float32 GEMMs (`integer_product`:
    exact, below), which multiplied those 256 rows in 16 ms and the head's 16 in 0.25 s."""

    SLAB_ROWS = 8192  # weight rows widened to float32 at a time (~20 MiB for 640 inputs)

    def __init__(self, w: torch.Tensor):
        super().__init__()
        self.top = int8_weight_max(w.device)
        w = w.float()
        scales = (w.abs().amax(dim=1) / self.top).clamp(min=1e-12)
        q = torch.round(w / scales[:, None]).clamp(-self.top, self.top).to(torch.int8)
        self.register_buffer("q", q)  # [out, in]; _int_mm reads its transpose in place
        self.register_buffer("scales", scales)

    def integer_product(self, a: torch.Tensor) -> torch.Tensor:
        """a [rows, in] int8 → a · qᵀ as int32, the same integers as `torch._int_mm`, by float32
        GEMMs. NOTE: exact: every product is an integer of at most 127 · top, and a float32
        holds every integer below 2^24, so a sum over `span` inputs, in any order, is exact
        while span · 127 · top < 2^24; longer rows are summed span by span in int32."""
        span = ((1 << 24) - 1) // (127 * self.top)
        af = a.float()
        out = torch.empty(a.shape[0], self.q.shape[0], dtype=torch.int32, device=a.device)
        for r0 in range(0, self.q.shape[0], self.SLAB_ROWS):
            slab = self.q[r0 : r0 + self.SLAB_ROWS]
            total = None
            for k0 in range(0, slab.shape[1], span):
                part = (af[:, k0 : k0 + span] @ slab[:, k0 : k0 + span].float().t()).to(torch.int32)
                total = part if total is None else total.add_(part)
            out[:, r0 : r0 + slab.shape[0]] = total
        return out

    def dequantized(self) -> torch.Tensor:
        return (self.q.float() * self.scales[:, None]).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x if x.dtype == torch.float32 else x.float()
        amax = x32.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12)
        a = torch.round(x32 * (127 / amax)).to(torch.int8)
        slow_int_mm = a.device.type == "cpu" and self.top < 127  # the CPU has no VNNI
        if slow_int_mm and a.shape[0] > 1:
            out = self.integer_product(a).mul(self.scales)
        else:
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

    def __init__(self, w: torch.Tensor, group: int = INT4_GROUP):
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
        # The bf16 matrix of the same integers: large steps multiply by it (Int4Method keeps it
        # as the layer's weight; this is the same tensor, not a second copy).
        dequant = ((q - 8) * scale[..., None] + zero[..., None]).view(w.shape)
        self._dequantized = dequant.to(torch.bfloat16)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            q.to(torch.int32).view(out_features, in_features), 1
        )
        self.register_buffer("packed", packed)
        sz = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()
        self.register_buffer("scales_zeros", sz.to(torch.bfloat16))
        self.group = group

    def dequantized(self) -> torch.Tensor:
        return self._dequantized

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, self.packed, self.group, self.scales_zeros
        )


class _QuantizedMethod(LinearMethod):
    """Quantises the layer's loaded dense weights in `finish`; its kernel serves every step."""

    kind = "quantized"

    def make_kernel(self, w: torch.Tensor) -> nn.Module:
        raise NotImplementedError

    def finish(self, layer: nn.Module) -> None:
        self.kernel = self.make_kernel(layer.weight.data)
        layer.weight = dropped(layer.weight)  # the kernel takes every step

    def kernel_for(self, rows: int) -> str:
        return self.kind

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        y = self.kernel(x)
        return y if bias is None else y + bias


class Int8Method(_QuantizedMethod):
    kind = "int8-w8a8"

    def make_kernel(self, w: torch.Tensor) -> nn.Module:
        return Int8Kernel(w)


class Fp8Method(_QuantizedMethod):
    kind = "fp8-w8a8"

    def make_kernel(self, w: torch.Tensor) -> nn.Module:
        return Fp8Kernel(w)


class Int4Method(LinearMethod):
    """The int4 kernel for steps of at most `max_rows` rows; larger steps use the exact bf16
    dequantisation of the same integers, kept as the layer's weight."""

    def __init__(self, max_rows: int):
        super().__init__()
        self.max_rows = max_rows

    def finish(self, layer: nn.Module) -> None:
        self.kernel = Int4Kernel(layer.weight.data)
        # A new Parameter, so a tied LM head no longer shares the embedding's matrix.
        layer.weight = nn.Parameter(self.kernel.dequantized(), requires_grad=False)

    def kernel_for(self, rows: int) -> str:
        return "int4" if rows <= self.max_rows else "gemm"

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        if x.shape[0] > self.max_rows:
            return F.linear(x, layer.weight, bias)
        y = self.kernel(x)
        return y if bias is None else y + bias

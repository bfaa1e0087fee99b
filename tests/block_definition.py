"""The block product's numeric definition (cpu_kernels/block_gemv.c), written out in PyTorch for
the tests of the kernels: the activations quantised exactly as the kernel does it, the exact
product of those with the weights, and the bound on what the kernel's float arithmetic may add.
"""

from __future__ import annotations

import torch

from inferd.layers.gguf_blocks import BlockWeight

FLOAT_EPS = 2.0**-24  # unit roundoff of float32


def quantize_like_the_kernel(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [m, k] → (16-bit integer activations, their per-32 scales), by block_gemv.c's float32
    arithmetic: d = absmax / 127, f = x * (1 / d), q1 = round-half-even(f),
    q2 = round((f - q1) * 256) clamped to ±127 (f - q1 is exact in float32); the activations
    are 256 q1 + q2 with scale d / 256. Same bits, so no rounding can flip."""
    m, k = x.shape
    xb = x.view(m, k // 32, 32)
    d = xb.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    f = xb * inv
    q1 = torch.round(f)
    q2 = torch.round((f - q1) * 256).clamp(-127, 127)
    return (q1 * 256 + q2).view(m, k), d / 256


def quantized(x: torch.Tensor) -> torch.Tensor:
    """The activations the kernel multiplies by, exactly (float64)."""
    m, k = x.shape
    a, d = quantize_like_the_kernel(x)
    return (a.view(m, k // 32, 32).double() * d.double()).view(m, k)


def exact_product(x: torch.Tensor, w: BlockWeight) -> torch.Tensor:
    """The kernel's result before float rounding: the quantised activations times the weights
    (scale * q + offset), exactly (float64: every partial sum here is exact to far below the
    float32 rounding that `float_bound` allows)."""
    return quantized(x) @ w.dequantized().double().t()


def float_bound(x: torch.Tensor, w: BlockWeight) -> torch.Tensor:
    """[m, n]: how far the kernel's float32 arithmetic may move each output from
    `exact_product`. Per weight block it rounds the integer sum to float, the scale times the
    activation step, and the fused multiply-add into the running sum (a second fused one for
    the offset term): at most 2 nb + 3 roundings of terms bounded by sum_k |xq_k| |w_k| each
    (nb blocks; Higham's gamma bound, to first order)."""
    k = x.shape[1]
    nb = k // min(p.group for p in w.parts)
    magnitude = quantized(x).abs() @ w.dequantized().double().abs().t()
    return (2 * nb + 3) * FLOAT_EPS * magnitude


def rounding_bound(x: torch.Tensor, w: BlockWeight) -> torch.Tensor:
    """[m, n]: how far rounding the activations can move each output from the float64 product.
    Each moves by at most half the second term's step d / 256 (a whole step where the clamp to
    ±127 bites, at exact ties): |y - exact| <= sum_k d_k / 256 * |w_nk|."""
    step = quantize_like_the_kernel(x)[1].double().expand(-1, -1, 32)
    return step.reshape(x.shape) @ w.dequantized().double().abs().t()

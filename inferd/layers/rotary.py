"""Rotary position embeddings (RoPE), including Llama 3, linear and YaRN frequency scaling.

Frequencies are computed exactly as HF transformers computes them, so float32 runs agree bit for
bit. The cos/sin of a step are computed once per distinct RoPE config and shared by all layers.
YaRN also scales cos and sin by its attention factor (`RotaryEmbedding.magnitude`), in every
table: PyTorch's and the C kernel's (`kernel_cos_sin`).
"""

from __future__ import annotations

import decimal
import functools
import math

import torch

from inferd.config import RopeConfig
from inferd.errors import ModelLoadError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "freq_factors")


def _kind(rope: RopeConfig) -> str:
    scaling = rope.scaling or {}
    return scaling.get("rope_type", scaling.get("type", "default"))


def inv_frequencies(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    """HF transformers' frequencies, float32, bit for bit (on the same CPU: PyTorch's `pow`
    is vectorised per instruction set, and its last bit differs between them)."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    powers = rope.theta**exponent
    if _kind(rope) == "yarn":
        return _yarn_inv_freq(powers, head_dim, rope)
    return _scaled(1.0 / powers, rope)


def portable_inv_frequencies(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    """The same frequencies from arithmetic that gives the same bits on every CPU, for the C
    kernels' RoPE tables (whose numbers must not depend on the machine): each power in decimal
    (software, 30 digits), the scaling in float64 (only +, -, *, /: IEEE rounds each the same
    everywhere), float32 last. With HF's, the default mode's logits changed with the CPU's
    vector width from positions of a few dozen on (tests/parity/test_cpu_independence.py)."""
    with decimal.localcontext() as context:
        context.prec = 30  # double needs 17 digits
        log_theta = decimal.Decimal(repr(float(rope.theta))).ln()
        sign = 1 if _kind(rope) == "yarn" else -1  # YaRN's arithmetic starts from theta^(i/d)
        powers = [float((sign * log_theta * i / head_dim).exp()) for i in range(0, head_dim, 2)]
    powers = torch.tensor(powers, dtype=torch.float64)
    if sign == 1:
        return _yarn_inv_freq(powers, head_dim, rope).float()
    return _scaled(powers, rope).float()


def yarn_magnitude(rope: RopeConfig) -> float:
    """YaRN's attention factor, by which cos and sin are scaled (1 for every other kind): the
    config's `attention_factor`, else 0.1 ln(factor) + 1 (DeepSeek's mscale ratio where the
    config gives `mscale` and `mscale_all_dim`), as transformers derives it."""
    if _kind(rope) != "yarn":
        return 1.0
    s = rope.scaling
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])
    factor = float(s["factor"])

    def mscale(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    if s.get("mscale") and s.get("mscale_all_dim"):
        return float(mscale(s["mscale"]) / mscale(s["mscale_all_dim"]))
    return mscale(1.0)


def _yarn_inv_freq(powers: torch.Tensor, head_dim: int, rope: RopeConfig) -> torch.Tensor:
    """YaRN (NTK-by-parts): frequencies that turn fewer than `beta_slow` times over the original
    context are divided by `factor` (interpolated), those turning more than `beta_fast` times
    kept (extrapolated), a linear ramp between; `powers` are theta^(i/d). transformers'
    operations, in the dtype of `powers` (float32: its bits; float64: the portable path)."""
    s, theta = rope.scaling, rope.theta
    factor = float(s["factor"])
    fast, slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1
    old_len = s["original_max_position_embeddings"]

    def dim_of(rotations: float) -> float:  # the dimension that turns `rotations` times
        return head_dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(fast), dim_of(slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = (torch.arange(head_dim // 2, dtype=powers.dtype) - low) / (high - low)
    extrapolated = 1 - torch.clamp(ramp, 0, 1)
    return (1.0 / (factor * powers)) * (1 - extrapolated) + (1.0 / powers) * extrapolated


def _scaled(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    scaling = rope.scaling or {}
    kind = _kind(rope)
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    if kind == "freq_factors":  # GGUF's rope_freqs tensor: per-frequency divisors
        return inv_freq / torch.tensor(scaling["factors"], dtype=torch.float32).to(inv_freq.dtype)
    raise ModelLoadError(
        f"unsupported rope_scaling type {kind!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
    )


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1: long wavelengths are divided by `factor`, short ones kept, the band between
    interpolated smoothly."""
    factor, low, high = (
        float(s["factor"]),
        float(s["low_freq_factor"]),
        float(s["high_freq_factor"]),
    )
    old_len = float(s["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding:
    """cos/sin tables for positions, and their application to q and k ("rotate half" layout)."""

    def __init__(self, head_dim: int, rope: RopeConfig, device: torch.device | None = None):
        self.head_dim = head_dim
        self.rope = rope
        self.inv_freq = inv_frequencies(head_dim, rope).to(device)
        self.magnitude = yarn_magnitude(rope)  # cos and sin scaled by it (YaRN; else 1)

    @functools.cached_property
    def portable_inv_freq(self) -> torch.Tensor:
        """The C kernels' frequencies (portable_inv_frequencies), on first use: only they read
        them."""
        return portable_inv_frequencies(self.head_dim, self.rope)

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and *signed* sin, [tokens, 1, head_dim], for `apply_rotary`."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.magnitude != 1.0:  # as HF: the float32 tables times the factor
            cos, sin = cos * self.magnitude, sin * self.magnitude
        half = sin.shape[-1] // 2
        sin[:, :half].neg_()  # rotate_half(x) * sin == swap_halves(x) * (-sin, +sin)
        return cos.to(dtype)[:, None, :], sin.to(dtype)[:, None, :]


def kernel_cos_sin(lib, inv_freq: torch.Tensor, positions: torch.Tensor,
                   magnitude: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """`RotaryEmbedding.cos_sin` in float32 by inferd's C kernel, [tokens, head_dim]: each value
    by libm's cosf / sinf, so a position's table never depends on the other positions of the
    step (PyTorch's vectorised sin and its scalar tail may round apart; where the tail falls
    depends on the tensor's size and the threads). `magnitude`: YaRN's scale of both tables
    (one IEEE product per value: the same bits whatever the step)."""
    positions = positions.contiguous()
    inv_freq = inv_freq.float().contiguous()
    cos = torch.empty(positions.shape[0], 2 * inv_freq.shape[0])
    sin = torch.empty_like(cos)
    lib.inferd_rope_tables(positions.data_ptr(), positions.shape[0], inv_freq.data_ptr(),
                           inv_freq.shape[0], cos.data_ptr(), sin.data_ptr())  # fmt: skip
    if magnitude != 1.0:
        cos.mul_(magnitude)
        sin.mul_(magnitude)
    return cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x: [tokens, heads, head_dim]; the halves of each head rotate as (x1, x2) pairs, HF's
    "rotate half" layout. Same products and sum as x * cos + rotate_half(x) * sin."""
    n, heads, dim = x.shape
    swapped = x.view(n, heads, 2, dim // 2).flip(2).view(n, heads, dim)
    return torch.addcmul(x * cos, swapped, signed_sin)

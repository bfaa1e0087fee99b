"""`--quantization gguf`: GGUF blocks unpacked without changing a weight, and the C kernels.

Unpacking is checked bit for bit against the `gguf` package's dequantisation, on random blocks of
every type. The matrix-vector kernel, in every ISA variant this CPU runs (tests/kernel_variants.py),
is checked against its definition: the activations quantised to two int8 terms per 32 values
(16-bit) exactly as the kernel does it, so the integer sums are exact and only float rounding of
the scaled sums remains; and against the exact float product, within the bound the activation
rounding implies.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from kernel_variants import VARIANT_NAMES, variant_library

from inferd.layers.gguf_blocks import BlockWeight, stack
from inferd.layers.norm import kernel_rms_norm
from inferd.loader import gguf_quants as gq

# byte offsets of each type's fp16 fields (scales, mins): random bytes there could be NaN/inf
FP16_FIELDS = {
    gq.Q4_0: [0], gq.Q4_1: [0, 2], gq.Q5_0: [0], gq.Q5_1: [0, 2], gq.Q8_0: [0],
    gq.Q2_K: [80, 82], gq.Q3_K: [108], gq.Q4_K: [0, 2], gq.Q5_K: [0, 2], gq.Q6_K: [208],
}  # fmt: skip


def random_tensor(ggml_type: int, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    block, nbytes = gq.BLOCK_LAYOUT[ggml_type]
    blocks = rng.integers(0, 256, size=(rows * cols // block, nbytes), dtype=np.uint8)
    for start in FP16_FIELDS[ggml_type]:
        scales = rng.uniform(-0.05, 0.05, size=blocks.shape[0]).astype(np.float16)
        blocks[:, start : start + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(-1)


@pytest.mark.parametrize("ggml_type", sorted(FP16_FIELDS), ids=gq.type_name)
def test_unpacked_blocks_are_the_dequantised_weights_bit_for_bit(ggml_type):
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize as reference

    rows, cols = 8, 512
    raw = random_tensor(ggml_type, rows, cols)
    expected = torch.from_numpy(reference(raw, GGMLQuantizationType(ggml_type)).copy())
    dense = gq.dequantize(raw, ggml_type, (rows, cols))
    assert torch.equal(dense, expected.reshape(rows, cols))
    blocks = BlockWeight(*gq.unpack(raw, ggml_type, (rows, cols)))
    part = blocks.parts[0]
    assert part.group == (16 if ggml_type in (gq.Q2_K, gq.Q3_K, gq.Q6_K) else 32)
    # stored in as few bits as the type needs (random blocks use the whole range)
    expected_bits = {gq.Q2_K: 4, gq.Q3_K: 4, gq.Q4_0: 4, gq.Q4_1: 4, gq.Q4_K: 4, gq.Q5_0: 5,
                     gq.Q5_1: 5, gq.Q5_K: 5}  # fmt: skip
    assert part.bits == expected_bits.get(ggml_type, 8)
    assert torch.equal(blocks.dequantized(), dense)
    assert torch.equal(blocks.dequantized(torch.tensor([5, 1])), dense[[5, 1]])


def test_stacking_parts_with_different_groups_keeps_every_weight():
    torch.manual_seed(0)

    def part(group, with_offset):
        q = torch.randint(-16, 16, (4, 64), dtype=torch.int8)
        offset = torch.randn(4, 64 // group) if with_offset else None
        return BlockWeight(q, torch.rand(4, 64 // group), offset)

    weights = [part(32, False), part(32, False), part(16, False), part(32, True)]
    stacked = stack(weights)
    # the first two share a layout and merge; the others keep their own
    assert [p.shape[0] for p in stacked.parts] == [8, 4, 4]
    assert torch.equal(stacked.dequantized(), torch.cat([w.dequantized() for w in weights]))


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


def emulate(x: torch.Tensor, w: BlockWeight) -> torch.Tensor:
    """What the kernel computes, in float64: the integer activations times the weights'
    integers with their scales; offsets times the exact float sums."""
    m, k = x.shape
    q, d = quantize_like_the_kernel(x)
    xq = (q.view(m, k // 32, 32).double() * d.double()).view(m, k)
    out = []
    for p in w.parts:
        scale = p.scale.double().repeat_interleave(p.group, 1)
        y = xq @ (p.integers().double() * scale).t()
        if p.offset is not None:
            y += x.view(m, k // p.group, p.group).double().sum(-1) @ p.offset.double().t()
        out.append(y)
    return torch.cat(out, dim=1).float()


def rounding_bound(x: torch.Tensor, w: BlockWeight) -> torch.Tensor:
    """[m, n]: how far rounding the activations can move each output. Each moves by at most half
    the second term's step d / 256 (a whole step where the clamp to ±127 bites, at exact
    ties): |y - exact| <= sum_k d_k / 256 * |w_nk|."""
    step = quantize_like_the_kernel(x)[1].double().expand(-1, -1, 32)
    return step.reshape(x.shape) @ w.dequantized().double().abs().t()


@pytest.fixture(scope="module", params=VARIANT_NAMES)
def kernels(request):
    lib = variant_library(request.param)
    assert lib.inferd_kernel_isa().decode() == request.param
    return lib


@pytest.mark.parametrize("group", [16, 32])
@pytest.mark.parametrize("with_offset", [False, True])
# 48 outputs: rows in groups of four (interleaved); 22: not, and a last group of two
@pytest.mark.parametrize("rows, in_features, out_features",
                         [(1, 640, 48), (3, 96, 22), (8, 2048, 48), (11, 64, 22)])  # fmt: skip
@pytest.mark.parametrize(
    "q_range, fp16_scales", [((-128, 128), True), ((-16, 16), False), ((0, 16), True)]
)  # 8, 5 and 4 bits (96 inputs: 8 bits whatever the range, and a last half chunk)
def test_block_kernel_matches_its_definition(kernels, group, with_offset, rows, in_features,
                                             out_features, q_range, fp16_scales):  # fmt: skip
    torch.manual_seed(rows * in_features + group)
    q = torch.randint(*q_range, (out_features, in_features), dtype=torch.int8)
    scale = torch.rand(out_features, in_features // group) * 0.02
    if fp16_scales:
        scale = scale.half().float()
    offset = torch.randn(out_features, in_features // group) * 0.01 if with_offset else None
    w = stack(
        [
            BlockWeight(q[:16], scale[:16], None if offset is None else offset[:16]),
            BlockWeight(q[16:], scale[16:], None if offset is None else offset[16:]),
        ]
    )
    assert w.parts[0].scale.dtype == (torch.float16 if fp16_scales else torch.float32)
    w.lib = kernels
    x = torch.randn(rows, in_features)
    x[0, :32] = 0  # an all-zero activation block (scale 0)
    x[-1, 32:64] = torch.arange(32) - 15.5  # halves of a step of 1 (the block's largest
    x[-1, 32] = 127.0  # value 127): ties, where the second term is clamped
    y = w(x)
    expected = emulate(x, w)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    exact = x.double() @ w.dequantized().double().t()
    slack = 1e-5 * exact.abs().max()  # float rounding of the scaled sums
    assert ((y.double() - exact).abs() <= rounding_bound(x, w) + slack).all()


@pytest.mark.parametrize("q_range", [(-128, 128), (-16, 16), (-8, 8)])  # 8, 5 and 4 bits
@pytest.mark.parametrize("group", [16, 32])
def test_block_kernel_does_not_saturate(kernels, q_range, group):
    """The largest products there are: every weight at an end of its range, both activation
    terms at ±127 (int16 pair sums of 8-bit weights overflow unless the kernel splits them), and
    row 0's activations all of its weights' signs (its sum at the largest)."""
    torch.manual_seed(1)
    lo, hi = q_range[0], q_range[1] - 1
    q = torch.where(torch.rand(8, 256) < 0.5, lo, hi).to(torch.int8)
    w = BlockWeight(q, torch.full((8, 256 // group), 0.5), None)
    w.lib = kernels
    x = torch.where(torch.rand(2, 256) < 0.5, -1.0, 1.0)
    x[0] = torch.sign(q[0].float())
    x[:, 1:] *= 126.498 / 127  # q1 = 126 and a residual of 0.498 steps (q2 = 127) but for
    x[:, 0::32] = torch.sign(x[:, 0::32])  # each block's first, which sets the scale
    assert (quantize_like_the_kernel(x)[0].abs() == 126 * 256 + 127).sum() == 2 * 31 * 8
    torch.testing.assert_close(w(x), emulate(x, w), rtol=1e-6, atol=0)
    exact = 0.5 * (q[0].double() * x[0].double()).sum().item()
    assert w(x)[0, 0].item() == pytest.approx(exact, rel=1e-4)  # |row 0| at its largest


@pytest.mark.parametrize("ggml_type", [gq.Q8_0, gq.Q5_0, gq.Q4_K, gq.Q6_K], ids=gq.type_name)
def test_dense_weights_from_the_kernel_equal_the_dequantisation(kernels, ggml_type):
    rows, cols = 12, 512
    parts = gq.unpack(random_tensor(ggml_type, rows, cols, 4), ggml_type, (rows, cols))
    w = BlockWeight(*parts)
    w.lib = kernels
    expected = w.dequantized()
    torch.testing.assert_close(w.dense(torch.float32), expected, rtol=1e-6, atol=0)
    torch.testing.assert_close(w.dense(torch.bfloat16), expected.bfloat16(), rtol=8e-3, atol=0)


def test_rms_norm_kernel_matches_pytorch(kernels):
    x = torch.randn(5, 3, 256) * 3
    gain = torch.rand(256) + 0.5
    torch.testing.assert_close(kernel_rms_norm(kernels, x, gain, 1e-6),
                               F.rms_norm(x, (256,), gain, 1e-6))  # fmt: skip
    torch.testing.assert_close(kernel_rms_norm(kernels, x, None, 1e-6),
                               F.rms_norm(x, (256,), None, 1e-6))  # fmt: skip


def test_gguf_mode_without_kernels_says_why(monkeypatch):
    from inferd.layers.weight_scheme import check_quantization

    monkeypatch.setenv("INFERD_CPU_KERNELS", "0")
    with pytest.raises(ValueError, match="INFERD_CPU_KERNELS=0.*int8"):
        check_quantization("gguf", torch.device("cpu"))

"""`--quantization gguf`: GGUF blocks unpacked without changing a weight, and the C kernels.

Unpacking is checked bit for bit against the `gguf` package's dequantisation, on random blocks of
every type, and so are the layout's row lookups and dense copies. The block product, in every
ISA variant this CPU runs (tests/kernel_variants.py), is checked against its definition
(tests/block_definition.py): the activations quantised to two int8 terms per 32 values (16-bit)
exactly as the kernel does it, so the integer sums are exact and only the float rounding of the
scaled sums remains, within a bound derived from that arithmetic; and against the exact float
product, within the bound the activation rounding implies. Batch invariance and the variants'
agreement: tests/unit/test_block_invariance.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from block_definition import exact_product, float_bound, quantize_like_the_kernel, rounding_bound
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
                     gq.Q5_1: 5, gq.Q5_K: 5, gq.Q6_K: 6}  # fmt: skip
    assert part.bits == expected_bits.get(ggml_type, 8)
    assert torch.equal(blocks.dequantized(), dense)
    assert torch.equal(blocks.dequantized(torch.tensor([5, 1])), dense[[5, 1]])


@pytest.mark.parametrize("rows", [4, 16])  # 16: whole groups, joined as they are packed
def test_stacking_parts_with_different_groups_keeps_every_weight(rows):
    torch.manual_seed(0)

    def part(group, with_offset, n=rows):
        q = torch.randint(-16, 16, (n, 64), dtype=torch.int8)
        offset = torch.randn(n, 64 // group) if with_offset else None
        return BlockWeight(q, torch.rand(n, 64 // group), offset)

    weights = [part(32, False), part(32, False, 8), part(16, False), part(32, True)]
    stacked = stack(weights)
    # the first two share a layout and merge; the others keep their own
    assert [p.shape[0] for p in stacked.parts] == [rows + 8, rows, rows]
    assert torch.equal(stacked.dequantized(), torch.cat([w.dequantized() for w in weights]))


@pytest.fixture(scope="module", params=VARIANT_NAMES)
def kernels(request):
    lib = variant_library(request.param)
    assert lib.inferd_kernel_isa().decode() == request.param
    return lib


@pytest.mark.parametrize("group", [16, 32])
@pytest.mark.parametrize("with_offset", [False, True])
# outputs in groups of 16: 48 fill three; 22 leave a last group of six rows (padding)
@pytest.mark.parametrize("rows, in_features, out_features",
                         [(1, 640, 48), (3, 96, 22), (8, 2048, 48), (11, 64, 22)])  # fmt: skip
@pytest.mark.parametrize(
    "q_range, fp16_scales", [((-128, 128), True), ((-16, 16), False), ((0, 16), True)]
)  # 8, 5 and 4 bits (96 inputs: an odd number of 32-input blocks)
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
    expected_bits = 8 if q_range[0] == -128 else 5 if q_range[0] == -16 else 4
    assert {p.bits for p in w.parts} == {expected_bits}
    w.lib = kernels
    x = torch.randn(rows, in_features)
    x[0, :32] = 0  # an all-zero activation block (scale 0)
    x[-1, 32:64] = torch.arange(32) - 15.5  # halves of a step of 1 (the block's largest
    x[-1, 32] = 127.0  # value 127): ties, where the second term is clamped
    y = w(x)
    definition = exact_product(x, w)
    assert ((y.double() - definition).abs() <= float_bound(x, w)).all()
    exact = x.double() @ w.dequantized().double().t()
    assert ((y.double() - exact).abs() <= rounding_bound(x, w) + float_bound(x, w)).all()


def test_a_wrong_integer_sum_leaves_the_float_bound():
    """The bound is tight enough to see one weight off by one, in one output."""
    torch.manual_seed(3)
    q = torch.randint(-128, 128, (16, 640), dtype=torch.int8)
    scale = torch.rand(16, 20) * 0.02
    x = torch.randn(4, 640)
    w, wrong = BlockWeight(q, scale, None), q.clone()
    wrong[5, 100] += 1 if wrong[5, 100] < 127 else -1
    gap = (exact_product(x, BlockWeight(wrong, scale, None)) - exact_product(x, w)).abs()
    assert (gap[:, 5] > float_bound(x, w)[:, 5]).all()


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
    assert ((w(x).double() - exact_product(x, w)).abs() <= float_bound(x, w)).all()
    exact = 0.5 * (q[0].double() * x[0].double()).sum().item()
    assert w(x)[0, 0].item() == pytest.approx(exact, rel=1e-4)  # |row 0| at its largest


@pytest.mark.parametrize("ggml_type", [gq.Q8_0, gq.Q5_0, gq.Q4_K, gq.Q6_K], ids=gq.type_name)
def test_dense_weights_from_the_kernel_equal_the_dequantisation(kernels, ggml_type):
    rows, cols = 44, 512  # three groups of 16 rows, the last padded
    raw = random_tensor(ggml_type, rows, cols, 4)
    w = BlockWeight(*gq.unpack(raw, ggml_type, (rows, cols)))
    w.lib = kernels
    expected = gq.dequantize(raw, ggml_type, (rows, cols))
    assert torch.equal(w.dense(torch.float32), expected)
    assert torch.equal(w.dense(torch.bfloat16), expected.bfloat16())
    assert torch.equal(w.dense(torch.float32, slice(5, 37)), expected[5:37])  # across groups
    assert torch.equal(w.dense(torch.float32, slice(40, 44)), expected[40:])  # the last rows


@pytest.mark.parametrize("q_range", [(-128, 128), (-16, 16), (-8, 8)])  # 8, 5 and 4 bits
@pytest.mark.parametrize("rows", [1, 16, 37])
def test_row_lookups_are_the_rows_of_the_dense_weights(q_range, rows):
    """An embedding lookup reads a few rows out of the grouped layout, in any order."""
    torch.manual_seed(rows)
    q = torch.randint(*q_range, (rows, 96), dtype=torch.int8)
    scale, offset = torch.rand(rows, 3), torch.randn(rows, 3)
    w = BlockWeight(q, scale, offset)
    expected = scale.repeat_interleave(32, 1) * q.float() + offset.repeat_interleave(32, 1)
    assert torch.equal(w.dequantized(), expected)
    ids = torch.randint(0, rows, (7,))
    assert torch.equal(w.dequantized(ids), expected[ids])
    assert torch.equal(w.parts[0].integers(ids), q[ids].to(torch.int16))


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


@pytest.mark.parametrize("lo, hi", [(0, 16), (0, 32), (-128, 128)])
def test_a_lookup_of_few_rows_by_the_kernel_gives_the_tensor_path_bits(lo, hi):
    # BlockWeight.dequantized takes the C kernel for up to FEW_ROWS ids (an embedding lookup
    # of a decode step), the tensor ops of BlockPart beyond: both the GGUF dequantisation.
    torch.manual_seed(0)
    q = torch.randint(lo, hi, (40, 64), dtype=torch.int8)
    w = BlockWeight(q, torch.rand(40, 2) * 0.01, torch.randn(40, 2) * 0.01)
    part = w.parts[0]
    ids = torch.tensor([39, 0, 17, 17, 5])
    assert torch.equal(w.dequantized(ids), part.dequantized(ids))
    many = torch.arange(40)  # more than FEW_ROWS: the tensor path itself
    assert torch.equal(w.dequantized(many)[ids], w.dequantized(ids))

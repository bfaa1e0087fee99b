"""The int8 KV cache row (inferd/kv_int8.py, cpu_kernels/kv_int8.h): its round-trip error bound,
the C quantisation byte for byte against PyTorch's in every ISA variant, rows that depend only
on their own vector, and a zeroed block that reads back as zeros."""

from __future__ import annotations

import pytest
import torch
from kernel_variants import VARIANT_NAMES, variant_library

from inferd.kv_int8 import INT8_KV, SCALE_BYTES, dequantize, quantize, row_width, scales


def vectors(rows: int, dim: int, seed: int = 0) -> torch.Tensor:
    """Rows of very different magnitudes (1e-6 to 1e4), a zero row, exact ties at x/scale = k + 1/2
    and a row whose extreme is negative."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim, generator=gen) * torch.logspace(-6, 4, rows)[:, None]
    x[1] = 0.0
    x[2] = torch.arange(dim) % 8 - 3.5  # ties: max|x| 4 -> scale 4/127, and halves of it
    x[2, 0] = 127.0  # scale 1: every other value is a tie, k + 1/2
    x[3, 5] = -3 * x[3].abs().max()
    return x


def test_layout_and_round_trip_error():
    x = vectors(64, 40)
    rows = quantize(x)
    assert rows.dtype == INT8_KV and rows.shape == (64, 40 + SCALE_BYTES)
    assert row_width(40, INT8_KV) == 44 and row_width(40, torch.bfloat16) == 40
    amax = x.abs().amax(-1, keepdim=True)
    torch.testing.assert_close(scales(rows), amax / 127, rtol=0, atol=0)
    codes = rows[:, :40].long()
    assert codes.abs().max() == 127 and codes.min() >= -127  # symmetric: -128 never used
    assert torch.equal(codes[1], torch.zeros(40, dtype=torch.long))  # all-zero row: scale 0
    assert scales(rows)[1].item() == 0.0
    # -2.5 -1.5 -0.5 0.5 1.5 2.5 3.5 -3.5: ties go to the even code
    assert torch.equal(codes[2, 1:9], torch.tensor([-2, -2, 0, 0, 2, 2, 4, -4]))
    err = (dequantize(rows) - x).abs()
    # |x - q scale| <= scale / 2, plus the round-off of x / scale and q * scale
    assert (err <= amax / 254 * (1 + 1e-5)).all()
    assert torch.equal(dequantize(rows, torch.bfloat16), dequantize(rows).bfloat16())


def test_a_row_depends_only_on_its_vector():
    """The same vector gives the same bytes alone, among others, or from a bf16 copy of itself
    (the scale is per token and KV head, nothing else takes part)."""
    x = vectors(32, 24)
    whole = quantize(x.view(4, 8, 24))  # [tokens, kv heads, head_dim]
    assert torch.equal(whole.view(32, -1)[7], quantize(x[7]))
    assert torch.equal(quantize(x[5:6].bfloat16()), quantize(x[5:6].bfloat16().float()))


def test_a_zeroed_row_reads_back_as_zeros():
    """The runner clears blocks by zeroing their bytes: codes 0, scale 0.0."""
    rows = torch.zeros(3, 16 + SCALE_BYTES, dtype=INT8_KV)
    assert torch.equal(dequantize(rows), torch.zeros(3, 16))


@pytest.mark.parametrize("variant", VARIANT_NAMES)
@pytest.mark.parametrize("dim", [40, 256, 7])
def test_c_quantisation_gives_pytorchs_bytes(variant, dim):
    """What the C decoder layer writes into an int8 cache (kv_int8.h) equals `quantize`, in every
    ISA variant (emulated where this CPU lacks it), for head sizes that fill no vector register,
    several, and an odd one."""
    lib = variant_library(variant)
    x = vectors(200, dim, seed=dim)  # 200 rows: the threads share them
    out = torch.empty(200, dim + SCALE_BYTES, dtype=INT8_KV)
    lib.inferd_kv_int8_quantize(x.data_ptr(), 200, dim, out.data_ptr())
    assert torch.equal(out, quantize(x))

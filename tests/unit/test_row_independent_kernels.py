"""The C kernels between the block products, in every variant this CPU runs: a row's result
does not depend on the other rows of the call, nor on where the row lies in memory (a sum the
compiler vectorised on its own could start its lanes wherever the row's address is aligned), nor
on the number of rows (RMSNorm spreads many rows over the threads); RoPE tables give a position
the same bits whatever positions share the call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_variants import VARIANT_NAMES, variant_library

from inferd.layers.norm import kernel_rms_norm
from inferd.layers.rotary import kernel_cos_sin


@pytest.fixture(scope="module", params=VARIANT_NAMES)
def lib(request):
    return variant_library(request.param)


def test_rms_norm_gives_a_row_the_same_bits_in_any_call(lib):
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(40, 640, generator=gen) * torch.rand(40, 1, generator=gen) * 10
    gain = torch.rand(640, generator=gen) + 0.5
    every = kernel_rms_norm(lib, rows, gain, 1e-6)  # 40 rows: spread over the threads
    torch.testing.assert_close(every, F.rms_norm(rows, (640,), gain, 1e-6))
    for i in (0, 7, 39):
        assert torch.equal(kernel_rms_norm(lib, rows[i : i + 1], gain, 1e-6), every[i : i + 1])
    buffer = torch.empty(40 * 640 + 3)
    for shift in (1, 2, 3):  # rows starting 4, 8 or 12 bytes past the original alignment
        moved = buffer[shift : shift + 40 * 640].view(40, 640)
        moved.copy_(rows)
        assert torch.equal(kernel_rms_norm(lib, moved, gain, 1e-6), every), shift


def test_rope_tables_give_a_position_the_same_bits_in_any_call(lib):
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 256, 2).float() / 256))
    positions = torch.arange(0, 700)
    cos, sin = kernel_cos_sin(lib, inv_freq, positions)
    angles = (positions.float()[:, None] * inv_freq[None, :]).double()  # as RotaryEmbedding's
    torch.testing.assert_close(cos[:, :128].double(), angles.cos(), rtol=0, atol=2e-7)
    torch.testing.assert_close(sin[:, 128:].double(), angles.sin(), rtol=0, atol=2e-7)
    assert torch.equal(sin[:, :128], -sin[:, 128:]) and torch.equal(cos[:, :128], cos[:, 128:])
    for some in (torch.tensor([699]), torch.tensor([5, 640, 3]), positions[100:164]):
        c, s = kernel_cos_sin(lib, inv_freq, some)
        assert torch.equal(c, cos[some]) and torch.equal(s, sin[some])


def test_argmax_gives_a_row_the_same_index_in_any_call(lib):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(9, 5000, generator=gen)
    x[3, [17, 4000]] = 9.0  # a tie: the lowest index
    every = torch.empty(9, dtype=torch.int64)
    lib.inferd_argmax_rows(x.data_ptr(), 9, 5000, every.data_ptr())
    assert torch.equal(every, x.argmax(-1))
    one = torch.empty(1, dtype=torch.int64)
    for i in range(9):
        row = x[i : i + 1].contiguous()
        lib.inferd_argmax_rows(row.data_ptr(), 1, 5000, one.data_ptr())
        assert one.item() == every[i].item()

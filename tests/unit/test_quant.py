"""Re-quantised weights: the integer kernel (small steps) and the bf16 dequantised matrix
(large steps) are the same model, and both stay close to the original weights; a layer's method
picks between them by the step's rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inferd.layers.linear import Linear
from inferd.layers.quant import Fp8Kernel, Int4Kernel, Int8Kernel
from inferd.layers.weight_scheme import WeightScheme


@pytest.mark.parametrize("kernel_cls, rel_err", [(Int8Kernel, 0.01), (Int4Kernel, 0.1)])
def test_kernel_equals_its_dequantised_matrix(kernel_cls, rel_err):
    torch.manual_seed(0)
    w = torch.randn(256, 128) * 0.05
    kernel = kernel_cls(w)
    # (int8 also quantises the activations, so its tolerance covers that rounding too)
    dq = kernel.dequantized()
    x = torch.randn(3, 128).bfloat16()
    small = kernel(x).float()
    large = F.linear(x.float(), dq.float())
    # Same integers: only rounding of the bf16 products/sums differs.
    torch.testing.assert_close(small, large, rtol=2e-2, atol=2e-2)
    # The quantisation error itself is bounded (per-weight, relative to the row's range).
    err = (dq.float() - w).abs().max() / w.abs().max()
    assert err < rel_err


def test_int4_groups_hold_16_levels_each():
    w = torch.linspace(-1, 1, 64).repeat(16, 1)
    kernel = Int4Kernel(w)
    dq = kernel.dequantized().float()
    assert all(len(torch.unique(g)) <= 16 for g in dq.reshape(-1, 32))


def test_int8_rows_do_not_depend_on_the_rest_of_the_batch():
    torch.manual_seed(2)
    kernel = Int8Kernel(torch.randn(96, 64) * 0.05)
    x = torch.randn(9, 64).bfloat16()
    together = kernel(x)
    for i in range(9):
        assert torch.equal(kernel(x[i : i + 1]), together[i : i + 1])


def test_linear_switches_kernels_by_step_size():
    torch.manual_seed(1)
    lin = Linear(64, 96, True, WeightScheme("int4", torch.bfloat16, quantize="int4"))
    lin.weight.data.normal_(0, 0.05)
    lin.bias.data.normal_(0, 0.05)
    lin.finish_loading()
    method = lin.quant_method
    assert (method.kernel_for(2), method.kernel_for(16)) == ("int4", "gemm")
    calls = []
    method.kernel.register_forward_hook(lambda mod, args, out: calls.append(args[0].shape[0]))
    small = lin(torch.randn(2, 64).bfloat16())
    large = lin(torch.randn(16, 64).bfloat16())
    assert calls == [2]  # only the small step used the integer kernel
    assert small.shape == (2, 96) and large.shape == (16, 96)
    # the large step multiplies by the same integers, dequantised
    x = torch.randn(16, 64).bfloat16()
    expected = F.linear(x.float(), method.kernel.dequantized().float(), lin.bias.float())
    torch.testing.assert_close(lin(x).float(), expected, rtol=2e-2, atol=2e-2)


def test_int8_layer_drops_its_dense_matrix():
    torch.manual_seed(4)
    lin = Linear(64, 32, False, WeightScheme("int8", torch.bfloat16, quantize="int8"))
    lin.weight.data.normal_(0, 0.05)
    dense = lin.weight.data.float().clone()
    lin.finish_loading()
    assert lin.weight.numel() == 0 and lin.quant_method.kernel_for(64) == "int8-w8a8"
    x = torch.randn(5, 64)
    torch.testing.assert_close(lin(x), x @ dense.t(), rtol=3e-2, atol=3e-2)


def test_fp8_kernel_matches_its_dequantised_matrix():
    torch.manual_seed(3)
    w = torch.randn(64, 128) * 0.05
    kernel = Fp8Kernel(w)
    x = torch.randn(5, 128).bfloat16()
    ref = F.linear(x.float(), kernel.dequantized().float())
    # e4m3 has 3 mantissa bits: activations are rounded to ~6% relative, weights likewise.
    torch.testing.assert_close(kernel(x).float(), ref, rtol=0.1, atol=0.05)
    assert (kernel.dequantized().float() - w).abs().max() / w.abs().max() < 0.07


def test_int8_weights_keep_to_what_the_cpu_sums_exactly(monkeypatch):
    import inferd.layers.quant as quant

    w = torch.randn(32, 64)
    monkeypatch.setattr(quant, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert Int8Kernel(w).q.abs().max().item() == 64  # no VNNI: int16 pair sums must not saturate
    monkeypatch.setattr(quant, "cpu_flags", lambda: frozenset({"avx2", "avx_vnni"}))
    assert Int8Kernel(w).q.abs().max().item() == 127


@pytest.mark.parametrize("top", [64, 127])
def test_int8_float_gemm_product_is_the_integer_matmul(top):
    """Without VNNI, steps of several rows take their int32 sums from float32 GEMMs: the exact
    integers (torch._int_mm's, where it is exact), here at the extremes (every product 127 ·
    top) over more inputs than one float32 span sums exactly, and more weight rows than one
    slab."""
    torch.manual_seed(3)
    kernel = Int8Kernel(torch.randn(40, 4160))
    kernel.top, kernel.SLAB_ROWS = top, 16
    kernel.q = torch.randint(-top, top + 1, (40, 4160), dtype=torch.int8)
    kernel.q[0] = top  # the largest sums: every product at its largest
    kernel.q[1] = top
    kernel.q[1, 1::3] = top - 1  # large and odd: beyond 2^24 a float32 would round them
    a = torch.randint(-127, 128, (5, 4160), dtype=torch.int8)
    a[0] = 127
    exact = (a.long() @ kernel.q.long().t()).int()  # not torch._int_mm: it saturates on some CPUs
    assert torch.equal(kernel.integer_product(a), exact)


def test_int8_steps_without_vnni_give_a_row_the_bits_it_has_alone(monkeypatch):
    import inferd.layers.quant as quant

    monkeypatch.setattr(quant, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    torch.manual_seed(4)
    kernel = Int8Kernel(torch.randn(96, 64) * 0.05)
    assert kernel.top == 64  # no VNNI: several rows go through integer_product
    x = torch.randn(9, 64)
    together = kernel(x)
    for i in range(9):  # one row: torch._int_mm
        assert torch.equal(kernel(x[i : i + 1]), together[i : i + 1])

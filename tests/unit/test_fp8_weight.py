"""FP8 (e4m3fn) weights kept as stored (inferd/layers/fp8_weight.py) and their C kernel
(cpu_kernels/fp8_gemm.c), in every ISA variant (emulated where this CPU lacks it,
tests/kernel_variants.py): every code converts like torch's float8_e4m3fn; products match a
float64 reference; a row's outputs are the same bits alone or in any batch (the few-row and the
panel ways, several thread counts); every variant gives the portable C's bits; bad input is
refused with a ValueError that names it."""

from __future__ import annotations

import ctypes

import pytest
import torch
from kernel_variants import VARIANT_NAMES, available_variants, variant_library

from inferd.layers import fp8_weight
from inferd.layers.fp8_weight import E4M3, Fp8Matrix, Fp8Weight

ALL_CODES = torch.arange(256, dtype=torch.uint8)
NAN_CODES = (0x7F, 0xFF)


@pytest.fixture(scope="module", params=VARIANT_NAMES)
def lib(request):
    return variant_library(request.param)


def torch_values(codes: torch.Tensor) -> torch.Tensor:
    return codes.view(torch.float8_e4m3fn).float()


def random_weight(n: int, k: int, seed: int, lib=None,
                  nan_row: int | None = None) -> tuple[Fp8Weight, torch.Tensor]:  # fmt: skip
    """A weight of random codes (no NaN, but one in `nan_row`) and row scales, and its float64
    values."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (n, k), dtype=torch.uint8, generator=g)
    codes[(codes & 0x7F) == 0x7F] = 0x38  # 1.0
    if nan_row is not None:
        codes[nan_row, 7] = 0xFF
    scale = torch.rand(n, generator=g) * 0.02 + 1e-4
    w = Fp8Weight(codes, scale)
    w.lib = lib
    return w, torch_values(codes).double() * scale.double()[:, None]


def test_every_code_decodes_like_torch_bit_for_bit():
    expected = torch_values(ALL_CODES)
    assert torch.equal(E4M3.isnan(), expected.isnan())
    assert E4M3.isnan().nonzero().flatten().tolist() == list(NAN_CODES)
    finite = ~expected.isnan()
    assert torch.equal(E4M3[finite].view(torch.int32), expected[finite].view(torch.int32))
    # dequantized: every code once, times a scale, the product torch's conversion gives
    codes = ALL_CODES.view(8, 32)
    scale = torch.tensor([1.0, 0.5, 3e-3, 7.0, 1e-30, 2.0, 1.0, 0.25])
    w = Fp8Weight(codes, scale)
    got, want = w.dequantized(), torch_values(codes) * scale[:, None]
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num().view(torch.int32), want.nan_to_num().view(torch.int32))
    rows = torch.tensor([6, 0, 6, 3])
    assert torch.equal(w.dequantized(rows).nan_to_num(), want[rows].nan_to_num())


def test_the_kernel_converts_every_code_like_torch(lib):
    """x = the identity: each output is one weight (times scale 1); a row holding a NaN code
    gives NaN everywhere, as its NaN weight would (0 * NaN)."""
    codes = ALL_CODES.view(8, 32)
    w = Fp8Weight(codes, torch.ones(8))
    w.lib = lib
    y = w(torch.eye(32)).T  # [8, 32]
    want = torch_values(codes)
    nan_rows = [code // 32 for code in NAN_CODES]
    assert y[nan_rows].isnan().all()
    others = [r for r in range(8) if r not in nan_rows]
    assert torch.equal(y[others], want[others])  # (+0 and -0 compare equal: a sum of +0s)


@pytest.mark.parametrize("n,k", [(1, 32), (17, 64), (100, 4096), (37, 4128)])
@pytest.mark.parametrize("m", [1, 3, 9, 16, 37])  # < 16: the few-row tiles; else panels
def test_products_match_a_float64_reference(lib, n, k, m):
    w, dense = random_weight(n, k, seed=n + k + m, lib=lib)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    y = w(x)
    assert y.dtype == torch.float32 and y.shape == (m, n)
    want = x.double() @ dense.T
    magnitude = x.double().abs() @ dense.abs().T  # what the rounding errors scale with
    assert ((y.double() - want).abs() / magnitude).max() < 2e-6


def check_alone_equals_batched(w: Fp8Weight, k: int, batches, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    probes = torch.randn(5, k, generator=g)
    alone = torch.cat([w(probes[i : i + 1]) for i in range(len(probes))])
    for m in batches:
        x = torch.randn(m, k, generator=g)
        x[:: max(1, m // 3)] = 0  # rows of zeros among them
        places = torch.randperm(m, generator=g)[: min(m, len(probes))]
        x[places] = probes[: len(places)]
        y = w(x)
        for i, place in enumerate(places.tolist()):
            assert torch.equal(y[place], alone[i]), (m, place)


def test_a_row_alone_equals_the_same_row_in_any_batch(lib):
    # 40 rows: groups of 16, 16 and 8 (padded); K = 288: panels of 256 and 32 inputs;
    # 200 rows: more than one chunk of rows of the panel way
    w, _ = random_weight(40, 288, seed=1, lib=lib)
    check_alone_equals_batched(w, 288, (2, 3, 5, 8, 15, 16, 17, 37, 100, 200), seed=2)


def test_the_thread_count_changes_no_bit(lib):
    w, _ = random_weight(200, 320, seed=3, lib=lib)
    x = torch.randn(37, 320, generator=torch.Generator().manual_seed(4))
    before = torch.get_num_threads()  # the kernels' OpenMP threads too
    try:
        results = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append((w(x), w(x[:5])))
    finally:
        torch.set_num_threads(before)
    for y, few in results[1:]:
        assert torch.equal(y, results[0][0]) and torch.equal(few, results[0][1])


@pytest.mark.parametrize("m", [1, 2, 7, 37])
def test_every_variant_gives_the_portable_bits(m):
    names = available_variants()
    if names == ["portable"]:
        pytest.skip("only the portable kernels run on this CPU: nothing to compare")
    w, _ = random_weight(50, 288, seed=5, nan_row=19)  # row 19's outputs: NaN in every variant
    x = torch.randn(m, 288, generator=torch.Generator().manual_seed(6)) * 100
    x[0, :5] = torch.tensor([1e-30, -1e-35, 0.0, -0.0, 3e30])  # tiny, zero, huge inputs
    results = {}
    for name in names:
        w.lib = variant_library(name)
        results[name] = w(x)
    assert results["portable"][:, 19].isnan().all()
    for name, y in results.items():
        assert torch.equal(y.view(torch.int32), results["portable"].view(torch.int32)), name


def test_nan_codes_from_the_checkpoint_make_their_rows_nan(lib):
    codes = torch.full((20, 64), 0x38, dtype=torch.uint8)  # 1.0
    codes[2, 5], codes[17, 63] = 0x7F, 0xFF
    w = Fp8Weight(codes, torch.ones(20))
    w.lib = lib
    y = w(torch.ones(3, 64))
    assert y[:, [2, 17]].isnan().all()
    assert torch.equal(y[:, [0, 1, 3, 16, 18, 19]], torch.full((3, 6), 64.0))


@pytest.mark.parametrize("m", [3, 20])
def test_columns_past_n_are_never_written(lib, m):
    w, _ = random_weight(40, 64, seed=7, lib=lib)
    x = torch.randn(m, 64)
    y = torch.full((m, 50), float("nan"))
    matrix = Fp8Matrix(w.codes.data_ptr(), w.kernel_scale.data_ptr(), 40, 64)
    assert lib.inferd_fp8_gemm(x.data_ptr(), m, ctypes.byref(matrix), y.data_ptr(), 50) == 0
    assert torch.equal(y[:, :40], w(x))
    assert y[:, 40:].isnan().all()


def test_shapes_the_kernel_cannot_run_are_refused(lib):
    w, _ = random_weight(8, 64, seed=8)
    x, y = torch.randn(2, 64), torch.empty(2, 8)

    def call(m: int, n: int, k: int, ldy: int) -> int:
        matrix = Fp8Matrix(w.codes.data_ptr(), w.kernel_scale.data_ptr(), n, k)
        return lib.inferd_fp8_gemm(x.data_ptr(), m, ctypes.byref(matrix), y.data_ptr(), ldy)

    assert call(2, 8, 64, 8) == 0
    assert call(0, 8, 64, 8) == call(2, 8, 64, 7) == call(2, 8, 48, 8) == call(2, 0, 64, 8) == -1


def test_bad_inputs_raise_value_errors_that_name_them():
    codes, scale = torch.zeros(4, 64, dtype=torch.uint8), torch.ones(4)
    with pytest.raises(ValueError, match=r"K a positive multiple of 32, got N=4, K=48"):
        Fp8Weight(torch.zeros(4, 48, dtype=torch.uint8), scale)
    with pytest.raises(ValueError, match=r"N >= 1"):
        Fp8Weight(torch.zeros(0, 64, dtype=torch.uint8), torch.ones(0))
    with pytest.raises(ValueError, match=r"codes must be a torch.uint8 tensor .* torch.float32"):
        Fp8Weight(codes.float(), scale)
    with pytest.raises(ValueError, match=r"view float8_e4m3fn weights as torch.uint8"):
        Fp8Weight(codes.view(torch.float8_e4m3fn), scale)
    with pytest.raises(ValueError, match=r"codes must be a 2-D"):
        Fp8Weight(codes.view(-1), scale)
    with pytest.raises(ValueError, match=r"scale must be a float32 tensor .* torch.float64"):
        Fp8Weight(codes, scale.double())
    with pytest.raises(ValueError, match=r"scale must be a CPU tensor \[N\] = \[4\].*\(5,\)"):
        Fp8Weight(codes, torch.ones(5))
    w = Fp8Weight(codes, scale.view(4, 1))  # [N, 1], as compressed-tensors stores it
    with pytest.raises(ValueError, match=r"x must be a float CPU tensor \[M, 64\].*\(2, 32\)"):
        w(torch.ones(2, 32))
    with pytest.raises(ValueError, match=r"x must be a float CPU tensor"):
        w(torch.ones(2, 64, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"rows must lie in \[0, 4\)"):
        w.dequantized(torch.tensor([4]))


def test_repacking_a_range_of_rows_at_a_time_changes_nothing(monkeypatch):
    """The layout is built a range of rows at a time (bounded temporaries): ranges that end
    inside the last group give the same bytes and the same products."""
    g = torch.Generator().manual_seed(9)
    codes = torch.randint(0, 256, (50, 64), dtype=torch.uint8, generator=g)
    scale = torch.rand(50, generator=g)
    whole = Fp8Weight(codes, scale)
    monkeypatch.setattr(fp8_weight, "CHUNK_BYTES", 16 * 64)  # one group of rows per range
    chunked = Fp8Weight(codes, scale)
    assert torch.equal(chunked.codes, whole.codes)
    assert torch.equal(chunked.kernel_scale.nan_to_num(), whole.kernel_scale.nan_to_num())
    assert torch.equal(chunked.kernel_scale.isnan(), whole.kernel_scale.isnan())
    assert torch.equal(whole.codes[3, :, 1], codes[49])  # row 49: group 3, row 1 of it
    want = torch_values(codes) * scale[:, None]  # read back a range of rows at a time too
    assert torch.equal(chunked.dequantized().nan_to_num(), want.nan_to_num())
    assert whole.codes[3, :, 2:].eq(0).all()  # rows 50..63: padding, code 0
    assert whole.nbytes == 64 * 64 + 50 * 4 + 64 * 4
    assert "out=50, in=64" in repr(whole)


def test_leading_dimensions_and_other_float_types(lib):
    w, dense = random_weight(24, 64, seed=10, lib=lib)
    x = torch.randn(2, 3, 64)
    y = w(x)
    assert y.shape == (2, 3, 24)
    assert torch.equal(y.view(6, 24), w(x.view(6, 64)))
    assert torch.equal(w(x.bfloat16()), w(x.bfloat16().float()))
    assert w(torch.empty(0, 64)).shape == (0, 24)

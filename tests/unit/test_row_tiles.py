"""`--deterministic` for the dense modes: the row-tiled dense method gives a row the same bits
whatever the other rows of its step, and the flag is refused, naming why, where it cannot hold
(GPU, tensor parallelism, int4 / fp8 kernels, no C kernels, the torch attention backend, an fp8
KV cache)."""

from __future__ import annotations

import pytest
import torch

from inferd.config import EngineConfig
from inferd.layers import weight_scheme as ws
from inferd.layers.linear import Linear
from inferd.layers.row_tiles import TILE_ROWS, RowTiledMethod, row_position_independent

CPU = torch.device("cpu")


class Dense:
    def __init__(self, w):
        self.w = w

    def load(self, dtype, rows=None, cols=None):
        start, n = rows
        return self.w[start : start + n].to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_gets_the_same_bits_in_any_step(c_kernels, dtype):
    scheme = ws.deterministic_scheme(ws.WeightScheme.dense(dtype), CPU, 1)
    lin = Linear(640, 1024, True, scheme)
    gen = torch.Generator().manual_seed(0)
    lin.load_shard("weight", Dense(torch.randn(1024, 640, generator=gen)), 0)
    lin.bias.data.normal_(generator=gen)
    lin.finish_loading()
    assert isinstance(lin.quant_method, RowTiledMethod) and lin.quant_method.tile == TILE_ROWS
    x = torch.randn(3 * TILE_ROWS + 5, 640, generator=gen).to(dtype)
    every = lin(x)
    torch.testing.assert_close(every.float(), torch.nn.functional.linear(
        x.float(), lin.weight.float(), lin.bias.float()), rtol=2e-2, atol=2e-2)  # fmt: skip
    for rows in (slice(0, 1), slice(5, 6), slice(7, 40), slice(TILE_ROWS, None)):
        assert torch.equal(lin(x[rows]), every[rows]), rows
    assert torch.equal(lin(x.flip(0)), every.flip(0))


def test_the_tile_check_sees_a_kernel_that_treats_positions_differently(monkeypatch):
    w = torch.randn(64, 32)
    assert row_position_independent(w, TILE_ROWS)
    real = torch.nn.functional.linear

    def position_dependent(x, weight, bias=None):
        y = real(x, weight, bias)
        return y + torch.arange(x.shape[0])[:, None] * 1e-3  # a row's bits depend on its place

    monkeypatch.setattr(torch.nn.functional, "linear", position_dependent)
    assert not row_position_independent(w, TILE_ROWS)
    method = RowTiledMethod()
    method.finish(torch.nn.Linear(32, 64))
    assert method.tile == 1  # one row per call: then nothing else shares it


def test_where_it_cannot_hold_it_is_refused(c_kernels, monkeypatch):
    dense = ws.WeightScheme.dense(torch.float32)
    with pytest.raises(ValueError, match="CPU only"):
        ws.deterministic_scheme(dense, torch.device("cuda"), 1)
    with pytest.raises(ValueError, match="tensor parallelism"):
        ws.deterministic_scheme(dense, CPU, 2)
    for method in ("int4", "fp8"):
        quantised = ws.WeightScheme(method, torch.bfloat16, quantize=method)
        with pytest.raises(ValueError, match=f"--quantization {method}"):
            ws.deterministic_scheme(quantised, CPU, 1)
    int8 = ws.deterministic_scheme(ws.WeightScheme("int8", torch.bfloat16, quantize="int8"),
                                   CPU, 1)  # fmt: skip
    assert int8.deterministic  # exact integer sums: row-independent by construction
    monkeypatch.setattr(ws, "_kernels_or_reason", lambda: (None, "no C compiler found"))
    with pytest.raises(ValueError, match="needs inferd's C kernels.*no C compiler"):
        ws.deterministic_scheme(dense, CPU, 1)


def test_engine_flags_it_cannot_hold_with_are_refused_before_loading(c_kernels):
    from inferd.engine.execution.model_setup import weight_scheme

    with pytest.raises(ValueError, match="fp8 caches"):
        weight_scheme(EngineConfig(deterministic=True, kv_cache_dtype="fp8"), CPU, None)
    with pytest.raises(ValueError, match="tensor parallelism"):
        weight_scheme(EngineConfig(deterministic=True, tensor_parallel_size=2), CPU, None)
    with pytest.raises(ValueError, match="cpu attention backend"):
        weight_scheme(EngineConfig(deterministic=True, attention_backend="torch"), CPU, None)
    scheme = weight_scheme(EngineConfig(deterministic=True, dtype="bfloat16"), CPU, None)
    assert scheme.deterministic and scheme.norm_kernel() is not None
    assert scheme.describe().startswith("bfloat16: dense bfloat16 weights, 16-row tiles")
    assert not scheme.head_shares_embedding()  # a tied head gets its own row tiles

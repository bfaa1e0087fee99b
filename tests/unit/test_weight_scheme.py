"""The weight scheme: which mode the flags and the machine choose, and the block method's choice
of kernel by the rows of a step (block kernel for few rows, GEMM on a bf16 copy or on weights
dequantised per step for many), on small random block weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inferd.layers import weight_scheme as ws
from inferd.layers.block_method import BlockMethod
from inferd.layers.gguf_blocks import BlockWeight
from inferd.layers.linear import Linear
from inferd.layers.linear_method import DenseMethod
from inferd.layers.quant import Int8Method

CPU = torch.device("cpu")


@pytest.fixture
def machine(monkeypatch):
    """Pretend CPU features and kernel availability."""

    def set_up(fast_bf16: bool, kernels: bool = True):
        monkeypatch.setattr("inferd.cpu_info.cpu_has_fast_bf16", lambda: fast_bf16)
        monkeypatch.setattr("inferd.platform.default_cpu_dtype",
                            lambda: "bfloat16" if fast_bf16 else "float32")  # fmt: skip
        lib = object() if kernels else None
        monkeypatch.setattr(ws, "_kernels_or_reason",
                            lambda: (lib, None if kernels else "no C compiler found"))  # fmt: skip

    return set_up


def test_default_on_a_gguf_file_keeps_its_blocks(machine):
    machine(fast_bf16=True)
    scheme = ws.choose_scheme(None, "auto", "gguf", CPU)
    assert (scheme.name, scheme.dtype, scheme.blocks, scheme.keep_copy) == (
        "gguf+bf16", torch.bfloat16, True, True)  # fmt: skip
    assert scheme.kv_cache_dtype == torch.float32 and scheme.activations == torch.float32
    assert scheme.decoder_rows == ws.DECODER_ROWS_WITH_COPY
    machine(fast_bf16=False)  # AVX2-only: no bf16 copy, float32 GEMM on dequantised blocks
    scheme = ws.choose_scheme(None, "auto", "gguf", CPU)
    assert (scheme.name, scheme.dtype, scheme.keep_copy) == ("gguf+float32", torch.float32, False)


@pytest.mark.parametrize("keep_copy", [True, False])
def test_the_c_decoder_stops_where_the_layers_block_kernels_stop(keep_copy):
    """A step of up to `decoder_rows` rows of any kind (a speculative verification step) must
    run on the kernels a one-row step runs (inferd/engine/speculative.py)."""
    scheme = ws.WeightScheme("test", torch.float32, blocks=True, keep_copy=keep_copy,
                             kernels=object())  # fmt: skip
    limits = [scheme.linear_method(kind).max_rows for kind in ("linear", "head", "embedding")]
    assert 0 < scheme.decoder_rows <= min(limits)


def test_the_scheme_says_what_it_is_and_why(machine):
    machine(fast_bf16=True)
    line = ws.choose_scheme(None, "auto", "gguf", CPU).describe()
    assert line.startswith("gguf+bf16: the GGUF blocks with C kernels for steps of up to 6 rows")
    assert line.endswith("; the default for a GGUF file on a CPU with fast bf16 (avx512_bf16 or "
                         "AMX)")  # fmt: skip
    machine(fast_bf16=False)
    line = ws.choose_scheme(None, "auto", "gguf", CPU).describe()
    assert "up to 16 rows (32 for the LM head), GEMM on float32 weights dequantised" in line
    assert line.endswith("on a CPU without fast bf16 (no avx512_bf16 or AMX)")
    assert ws.choose_scheme("gguf", "auto", "gguf", CPU).describe().endswith(
        "; chosen by --quantization gguf")  # fmt: skip
    assert ws.choose_scheme(None, "float32", "gguf", CPU).describe() == (
        "float32: dense float32 weights; chosen by --dtype float32")  # fmt: skip
    hf = ws.choose_scheme(None, "auto", "hf", CPU).describe()
    assert hf.endswith("the default for an HF checkpoint on a CPU without fast bf16 (no "
                       "avx512_bf16 or AMX)")  # fmt: skip
    machine(fast_bf16=False, kernels=False)
    assert ws.choose_scheme(None, "auto", "gguf", CPU).describe().endswith(
        "the default for a GGUF file without inferd's C kernels")  # fmt: skip


def test_flags_force_a_mode(machine):
    machine(fast_bf16=True)
    assert ws.choose_scheme(None, "float32", "gguf", CPU) == ws.WeightScheme.dense(torch.float32)
    assert ws.choose_scheme(None, "bfloat16", "gguf", CPU).blocks is False
    lean = ws.choose_scheme("gguf", "auto", "gguf", CPU)
    assert lean.blocks and not lean.keep_copy
    int8 = ws.choose_scheme("int8", "auto", "hf", CPU)
    assert (int8.quantize, int8.dtype, int8.activations) == ("int8", torch.bfloat16, torch.float32)
    with pytest.raises(ValueError, match="needs dtype bfloat16"):
        ws.choose_scheme("int8", "float32", "hf", CPU)
    with pytest.raises(ValueError, match="not a GGUF file"):
        ws.choose_scheme("gguf", "auto", "hf", CPU)
    with pytest.raises(ValueError, match="quantization must be one of"):
        ws.choose_scheme("nf4", "auto", "gguf", CPU)


def test_dense_where_blocks_cannot_serve(machine):
    machine(fast_bf16=True)
    assert not ws.choose_scheme(None, "auto", "hf", CPU).blocks  # an HF folder
    assert not ws.choose_scheme(None, "auto", "gguf", CPU, tensor_parallel=2).blocks
    machine(fast_bf16=False, kernels=False)
    scheme = ws.choose_scheme(None, "auto", "gguf", CPU)  # no C compiler
    assert scheme == ws.WeightScheme.dense(torch.float32)


def test_each_layer_asks_the_scheme_for_its_method(machine):
    machine(fast_bf16=True)
    scheme = ws.choose_scheme(None, "auto", "gguf", CPU)
    head, linear = scheme.linear_method("head"), scheme.linear_method("linear")
    assert isinstance(head, BlockMethod) and head.max_rows == ws.BLOCK_ROWS_WITH_COPY["head"]
    assert linear.max_rows == ws.BLOCK_ROWS_WITH_COPY["linear"]
    int8 = ws.WeightScheme("int8", torch.bfloat16, quantize="int8")
    assert isinstance(int8.linear_method("linear"), Int8Method)
    assert isinstance(int8.linear_method("embedding"), DenseMethod)  # lookups stay dense
    assert not int8.head_shares_embedding()


class FakeWeight:
    """A checkpoint tensor offering blocks (as a GGUF weight does) or only dense rows."""

    def __init__(self, blocks):
        self.blocks = blocks

    def load_blocks(self, rows=None, cols=None):
        if self.blocks is None:
            return None
        q, scale, offset = self.blocks
        start, n = rows
        return q[start : start + n], scale[start : start + n], offset

    def load(self, dtype, rows=None, cols=None):
        w = BlockWeight(*self.blocks).dequantized() if self.blocks else torch.ones(8, 64)
        start, n = rows
        return w[start : start + n].to(dtype)


def random_blocks(rows: int, cols: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-8, 8, (rows, cols), dtype=torch.int8, generator=gen)
    return q, torch.rand(rows, cols // 32, generator=gen) * 0.05, None


@pytest.mark.parametrize("keep_copy", [True, False])
def test_block_layer_picks_its_kernel_by_rows(c_kernels, keep_copy):
    scheme = ws.WeightScheme("test", torch.bfloat16, blocks=True, keep_copy=keep_copy,
                             kernels=c_kernels)  # fmt: skip
    lin = Linear(64, [8, 8], False, scheme)
    lin.load_shard("weight", FakeWeight(random_blocks(8, 64, 0)), 0)
    lin.load_shard("weight", FakeWeight(random_blocks(8, 64, 1)), 1)
    lin.finish_loading()
    method = lin.quant_method
    assert method.blocks is not None and lin.weight.numel() == 0  # the dense matrix is dropped
    limit = method.max_rows
    large = "gemm-copy" if keep_copy else "gemm-dequantised"
    assert [method.kernel_for(r) for r in (1, limit, limit + 1)] == ["blocks", "blocks", large]
    exact = method.blocks.dequantized()
    x = torch.randn(limit + 5, 64, generator=torch.Generator().manual_seed(3))
    few = lin(x[:limit])  # block kernel: activations rounded to 16 bits per 32 values
    # each activation moves by at most a second-term step (absmax / 127 / 256) when rounded
    step = x[:limit].view(limit, 2, 32).abs().amax(-1) / (127 * 256)
    bound = (step.repeat_interleave(32, 1) @ exact.abs().t()) * 1.001 + 1e-5
    assert ((few - x[:limit] @ exact.t()).abs() <= bound).all()
    assert method.dense_copy is None  # no large step yet: no copy
    many = lin(x)
    expected = F.linear(x.bfloat16(), exact.bfloat16()).float()
    torch.testing.assert_close(many, expected, rtol=1e-2, atol=1e-2)
    assert (method.dense_copy is not None) == keep_copy  # kept only with keep_copy


def test_a_dequantising_large_step_goes_slab_by_slab(c_kernels, monkeypatch):
    """Without a copy, a large step dequantises a slab of rows at a time (never the whole
    matrix); the slabs, parts of different layouts included, make the same product."""
    from inferd.layers import block_method

    scheme = ws.WeightScheme("test", torch.float32, blocks=True, kernels=c_kernels)
    lin = Linear(64, [200, 56], False, scheme)
    lin.load_shard("weight", FakeWeight(random_blocks(200, 64, 4)), 0)
    q, scale, _ = random_blocks(56, 64, 5)
    lin.load_shard("weight", FakeWeight((q * 4, scale, torch.rand(56, 2))), 1)  # 8 bits, offsets
    lin.finish_loading()
    method = lin.quant_method
    assert len(method.blocks.parts) == 2
    monkeypatch.setattr(block_method, "SLAB_WEIGHTS", 64 * 64)  # slabs of 64 rows: 4 of them
    sizes, real_dense = [], method.blocks.dense

    def spy(dtype, rows=slice(None)):
        sizes.append(rows)
        return real_dense(dtype, rows)

    monkeypatch.setattr(method.blocks, "dense", spy)
    x = torch.randn(method.max_rows + 1, 64)
    torch.testing.assert_close(lin(x), x @ method.blocks.dequantized().t(), rtol=1e-5, atol=1e-5)
    assert sizes == [slice(0, 64), slice(64, 128), slice(128, 192), slice(192, 256)]


def test_a_layer_with_a_dense_shard_stays_dense(c_kernels):
    scheme = ws.WeightScheme("test", torch.float32, blocks=True, kernels=c_kernels)
    lin = Linear(64, [8, 8], False, scheme)
    blocks = random_blocks(8, 64, 2)
    lin.load_shard("weight", FakeWeight(blocks), 0)
    lin.load_shard("weight", FakeWeight(None), 1)  # an unquantised tensor of the same layer
    lin.finish_loading()
    assert lin.quant_method.blocks is None and lin.quant_method.kernel_for(1) == "gemm"
    expected = torch.cat([BlockWeight(*blocks).dequantized(), torch.ones(8, 64)])
    torch.testing.assert_close(lin.weight.data, expected)


def test_start_up_says_which_weights_run(tmp_path, capsys):
    from tiny_models import make_tiny_checkpoint

    from inferd import LLM

    folder = make_tiny_checkpoint("llama", tmp_path / "llama")
    LLM(model=str(folder), dtype="float32", kv_cache_memory=4 << 20, max_model_len=64)
    lines = capsys.readouterr().err.splitlines()
    assert "inferd: weights: float32: dense float32 weights; chosen by --dtype float32" in lines

"""The weight scheme: which mode the flags and the machine choose, and the block method, which
multiplies by the blocks at every step size, each row's result independent of the others, on
small random block weights."""

from __future__ import annotations

import pytest
import torch

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


@pytest.mark.parametrize("fast_bf16", [True, False])
def test_default_on_a_gguf_file_keeps_its_blocks(machine, fast_bf16):
    """The same scheme on every CPU the kernels build on, and the same as --quantization gguf:
    the blocks at every step size, the file's float tensors in float32."""
    machine(fast_bf16=fast_bf16)
    scheme = ws.choose_scheme(None, "auto", "gguf", CPU)
    assert (scheme.name, scheme.dtype, scheme.blocks) == ("gguf", torch.float32, True)
    assert scheme.kv_cache_dtype == torch.bfloat16 and scheme.activations == torch.float32
    forced = ws.choose_scheme("gguf", "auto", "gguf", CPU)
    assert forced == scheme and forced.reason != scheme.reason
    assert ws.choose_scheme("gguf", "bfloat16", "gguf", CPU).dtype == torch.bfloat16


def test_the_scheme_says_what_it_is_and_why(machine):
    machine(fast_bf16=True)
    line = ws.choose_scheme(None, "auto", "gguf", CPU).describe()
    assert line == ("gguf: the GGUF blocks with C kernels at every step size (one C call for "
                    "all decoder layers of a step); the default for a GGUF file on a CPU with "
                    "inferd's C kernels")  # fmt: skip
    assert ws.choose_scheme("gguf", "auto", "gguf", CPU).describe().endswith(
        "; chosen by --quantization gguf")  # fmt: skip
    assert ws.choose_scheme(None, "float32", "gguf", CPU).describe() == (
        "float32: dense float32 weights; chosen by --dtype float32")  # fmt: skip
    machine(fast_bf16=False)
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
    assert ws.choose_scheme("gguf", "auto", "gguf", CPU).blocks
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
    assert isinstance(head, BlockMethod) and isinstance(linear, BlockMethod)
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


def test_block_layer_multiplies_by_the_blocks_at_every_step_size(c_kernels):
    scheme = ws.WeightScheme("test", torch.bfloat16, blocks=True, kernels=c_kernels)
    lin = Linear(64, [8, 8], False, scheme)
    lin.load_shard("weight", FakeWeight(random_blocks(8, 64, 0)), 0)
    lin.load_shard("weight", FakeWeight(random_blocks(8, 64, 1)), 1)
    lin.finish_loading()
    method = lin.quant_method
    assert method.blocks is not None and lin.weight.numel() == 0  # the dense matrix is dropped
    assert method.kernel_for(1) == method.kernel_for(4096) == "blocks"
    exact = method.blocks.dequantized()
    x = torch.randn(37, 64, generator=torch.Generator().manual_seed(3))
    many = lin(x)  # activations rounded to 16 bits per 32 values
    # each activation moves by at most a second-term step (absmax / 127 / 256) when rounded
    step = x.view(37, 2, 32).abs().amax(-1) / (127 * 256)
    bound = (step.repeat_interleave(32, 1) @ exact.abs().t()) * 1.001 + 1e-5
    assert many.dtype == torch.float32 and ((many - x @ exact.t()).abs() <= bound).all()
    # NOTE: the invariance the engine relies on: a row's bits whatever the other rows are
    assert all(torch.equal(lin(x[i : i + 1]), many[i : i + 1]) for i in range(37))
    assert torch.equal(lin(x.flip(0)), many.flip(0))


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


def test_a_dtype_set_by_a_catalog_entry_is_not_called_a_flag():
    origin = "the default of smollm2-135m-instruct (inferd/loader/catalog.py)"
    scheme = ws.choose_scheme(None, "float32", "gguf", torch.device("cpu"), dtype_origin=origin)
    assert scheme.describe().endswith(f"chosen by {origin}")
    assert "--dtype" not in scheme.describe()

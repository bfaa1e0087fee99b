"""gpt-oss's layers against transformers' modules on random inputs: the clamped SwiGLU, the
Mixture of Experts (a router with a bias, the softmax over the chosen experts, experts with
biases, the packed and interleaved HF layout read one matrix per expert), and the MXFP4 reader
(loader/hf_mxfp4.py) against transformers' own dequantisation."""

from __future__ import annotations

import pytest
import torch
import transformers
from in_memory_weight import InMemoryWeight as _Lazy
from transformers.integrations.mxfp4 import convert_moe_packed_tensors
from transformers.models.gpt_oss import modeling_gpt_oss as hf

from inferd.config import ModelConfig, MoEConfig
from inferd.layers.activation import clamped_swiglu
from inferd.layers.gguf_blocks import BlockWeight
from inferd.layers.moe import SparseMoE
from inferd.loader.hf_mxfp4 import MxFp4Weight, mxfp4_weights
from inferd.loader.tensor_layout import normalized
from inferd.models.registry import architecture

HIDDEN, INTER, EXPERTS = 64, 32, 4


def _hf_config(limit: float = 7.0) -> transformers.GptOssConfig:
    return transformers.GptOssConfig(
        hidden_size=HIDDEN, intermediate_size=INTER, num_local_experts=EXPERTS,
        num_experts_per_tok=2, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, swiglu_limit=limit,
    )  # fmt: skip


def test_clamped_swiglu_is_hf_s():
    gen = torch.Generator().manual_seed(0)
    gate_up = torch.randn(50, 2 * INTER, generator=gen) * 6  # many values past the limit
    experts = hf.GptOssExperts(_hf_config(limit=3.0))
    # HF interleaves gate and up; inferd's experts hold [gate | up]
    expected = experts._apply_gate(gate_up)
    halves = torch.cat([gate_up[:, ::2], gate_up[:, 1::2]], dim=1)
    assert torch.equal(clamped_swiglu(1.702, 3.0)(halves), expected)
    unclamped = clamped_swiglu(1.702, 1e9)(halves)
    assert (unclamped - expected).abs().max() > 1  # the clamps change values here


def _inferd_config() -> ModelConfig:
    moe = MoEConfig(EXPERTS, 2, INTER, False, biases=True, softmax_after_top_k=True,
                    swiglu_limit=7.0)  # fmt: skip
    return ModelConfig("gpt_oss", 300, HIDDEN, INTER, 1, 4, 2, 16, moe=moe)


def test_the_moe_layer_is_hf_s_on_its_packed_tensors():
    torch.manual_seed(0)
    mlp = hf.GptOssMLP(_hf_config()).eval()
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn_like(p) * 0.5)  # biases too; gate/up values past the limit
    config = _inferd_config()
    layer = SparseMoE(config, torch.float32)
    stored = {f"model.layers.0.mlp.{n}": _Lazy(p.detach()) for n, p in mlp.named_parameters()}
    pairs = normalized(stored.items(), architecture("gpt_oss"), config)
    weights = {n.removeprefix("model.layers.0.mlp."): w for n, w in pairs}
    assert set(weights) >= {"gate.weight", "gate.bias", "experts.3.up_proj.bias"}
    with torch.no_grad():
        for name, w in weights.items():
            if name.startswith("experts."):
                layer.experts.load_checkpoint_tensor(name.removeprefix("experts."), w)
            else:
                getattr(layer.gate, name.split(".")[1]).copy_(w.load(torch.float32))
    assert not layer.experts.missing_tensors()
    x = torch.randn(40, HIDDEN)
    with torch.no_grad():
        expected, _ = mlp(x[None])
        torch.testing.assert_close(layer(x), expected[0], rtol=1e-5, atol=1e-5)
        # a CUDA graph's path (every expert on every row, biases included) sums the same
        weights, chosen = layer.gate(x)
        every = layer.experts.every_expert(x, weights, chosen)
        torch.testing.assert_close(every, layer.experts(x, weights, chosen), rtol=1e-5,
                                   atol=1e-5)  # fmt: skip


def _hf_mxfp4(seed: int, shape: tuple[int, ...]):
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (*shape[:-1], shape[-1] // 32, 16), generator=gen)
    scales = torch.randint(110, 135, (*shape[:-1], shape[-1] // 32), generator=gen)
    return blocks.to(torch.uint8), scales.to(torch.uint8)


def test_mxfp4_weights_are_transformers_dequantised_values():
    """[experts, out, in] blocks: each expert's rows (and every other row: gate and up
    interleaved) as transformers dequantises them, as values and as the kernels' blocks."""
    blocks, scales = _hf_mxfp4(0, (EXPERTS, 2 * INTER, HIDDEN))
    expected = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, in, out]
    stored = [("x.gate_up_proj_scales", _Lazy(scales)), ("y", _Lazy(torch.zeros(2))),
              ("x.gate_up_proj_blocks", _Lazy(blocks))]  # fmt: skip
    (name, weight), other = list(mxfp4_weights(stored))[::-1]
    assert name == "x.gate_up_proj" and other[0] == "y"
    assert isinstance(weight, MxFp4Weight) and weight.shape == (EXPERTS, 2 * INTER, HIDDEN)
    for e in range(EXPERTS):
        one = weight.expert(e)
        assert torch.equal(one.load(torch.float32), expected[e].t())
        up = one.every(1, 2)
        assert torch.equal(up.load(torch.float32), expected[e].t()[1::2])
        assert torch.equal(up.load(torch.float32, rows=(3, 5), cols=(32, 32)),
                           expected[e].t()[1::2][3:8, 32:64])  # fmt: skip
        values = up.load_blocks((2, 6))
        as_blocks = BlockWeight(*values).dequantized()
        assert torch.equal(as_blocks, expected[e].t()[1::2][2:8])


def test_an_mxfp4_half_without_its_other_half_is_refused():
    from inferd.errors import ModelLoadError

    blocks, _ = _hf_mxfp4(1, (2, 32, 64))
    with pytest.raises(ModelLoadError, match="down_proj_scales"):
        list(mxfp4_weights([("m.down_proj_blocks", _Lazy(blocks))]))


def test_fp4_codes_cover_every_value():
    """Every code and a range of exponents (subnormal scales included) dequantise as HF's."""
    codes = torch.arange(256, dtype=torch.uint8).view(16, 16)  # each byte once
    blocks = codes.view(1, 16, 1, 16).expand(1, 16, 1, 16).contiguous()
    scales = torch.tensor([0, 1, 2, 60, 100, 126, 127, 128, 140, 200, 250, 254, 3, 9, 77, 130],
                          dtype=torch.uint8).view(1, 16, 1)  # fmt: skip
    expected = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)[0].t()
    got = MxFp4Weight(_Lazy(blocks), _Lazy(scales), "w").expert(0).load(torch.float32)
    assert torch.equal(got, expected)  # 0, subnormals, and past float32's range: inf

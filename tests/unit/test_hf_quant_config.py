"""`quantization_config` → the format inferd runs, or a refusal that names the method; the
packed layouts unpack to the integers that were packed (milliseconds, no model)."""

from __future__ import annotations

import json

import pytest
import torch
from in_memory_weight import InMemoryWeight
from quantized_checkpoints import awq_layer, gptq_layer, int8_layer

from inferd.errors import ModelLoadError
from inferd.loader.hf_quant_config import read_quant_format
from inferd.loader.hf_quant_weights import AwqWeight, GptqWeight, Int8Weight
from inferd.loader.hf_quantized import logical_shapes


def _fmt(qc: dict, tmp_path):
    return read_quant_format({"quantization_config": qc}, tmp_path)


@pytest.mark.parametrize("method", ["bitsandbytes", "exl2", "hqq", "aqlm", "eetq", "torchao"])
def test_other_methods_are_refused_by_name(method, tmp_path):
    with pytest.raises(ModelLoadError, match=f"quantised with '{method}'.*does not run"):
        _fmt({"quant_method": method}, tmp_path)


@pytest.mark.parametrize(("qc", "message"), [
    ({"quant_method": "awq", "bits": 3, "group_size": 128}, "3 bits"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "GEMM layout"),
    ({"quant_method": "awq", "bits": 4, "group_size": 100}, "group_size 100"),
    ({"quant_method": "gptq", "bits": 2, "group_size": 128}, "2 bits"),
    ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, "marlin"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {
        "g": {"weights": {"num_bits": 4, "type": "int", "strategy": "group"}}}}, "4-bit"),
    ({"quant_method": "compressed-tensors", "config_groups": {
        "g": {"weights": {"num_bits": 8, "type": "float", "strategy": "block"}}}}, "'block'"),
])  # fmt: skip
def test_unsupported_variants_are_refused_with_the_reason(qc, message, tmp_path):
    with pytest.raises(ModelLoadError, match=message):
        _fmt(qc, tmp_path)


def test_formats_are_described_with_their_bits(tmp_path):
    awq = _fmt({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, tmp_path)
    assert awq.describe() == ("AWQ 4-bit, groups of 128, zero points "
                              "(4.16 bits per weight in the file)")  # fmt: skip
    gptq = _fmt({"quant_method": "gptq", "bits": 8, "group_size": -1, "desc_act": True}, tmp_path)
    assert gptq.describe().startswith("GPTQ 8-bit, per output row, act-order")
    assert not gptq.zero_points and gptq.gptq_v1_zeros
    assert read_quant_format({}, tmp_path) is None  # no quantization_config: not quantised
    with pytest.raises(ModelLoadError, match="has no quant_method"):
        _fmt({"bits": 4}, tmp_path)


def test_gptq_quantize_config_json_beside_the_config_is_read(tmp_path):
    (tmp_path / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 32}))
    fmt = read_quant_format({}, tmp_path)
    assert (fmt.method, fmt.bits, fmt.group_size) == ("gptq", 4, 32)


def _values(weight) -> torch.Tensor:
    return weight.load(torch.float32)


@pytest.mark.parametrize("rows", [None, (8, 16), (3, 21)])  # row ranges, aligned or not
def test_awq_unpacks_to_its_dequantised_weight(rows, tmp_path):
    w = torch.randn(48, 64)
    tensors, deq = awq_layer(w, 32)
    fmt = _fmt({"quant_method": "awq", "bits": 4, "group_size": 32}, tmp_path)
    weight = AwqWeight({k: InMemoryWeight(v) for k, v in tensors.items()}, fmt, "x")
    assert weight.shape == (48, 64)
    want = deq if rows is None else deq[rows[0] : rows[0] + rows[1]]
    assert torch.allclose(weight.load(torch.float32, rows=rows), want, atol=1e-6)


@pytest.mark.parametrize(
    ("bits", "sym", "act_order"),
    [(4, True, False), (4, False, True), (8, False, False), (8, True, True)],
)
def test_gptq_unpacks_to_its_dequantised_weight(bits, sym, act_order, tmp_path):
    w = torch.randn(40, 128)
    tensors, deq = gptq_layer(w, bits, 32, sym, act_order, seed=1)
    qc = {"quant_method": "gptq", "bits": bits, "group_size": 32, "sym": sym,
          "desc_act": act_order}  # fmt: skip
    weight = GptqWeight({k: InMemoryWeight(v) for k, v in tensors.items()}, _fmt(qc, tmp_path), "x")
    assert (weight.input_order is not None) == act_order
    blocks = weight.load_blocks((5, 17))
    assert blocks.offset is None if sym else blocks.offset is not None  # Q4_0-like when sym
    assert torch.allclose(weight.load(torch.float32), deq, atol=1e-6)


def test_int8_channel_scales_become_block_scales(tmp_path):
    w = torch.randn(16, 96)
    tensors, deq = int8_layer(w, None)
    qc = {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {
        "num_bits": 8, "type": "int", "strategy": "channel"}}}}  # fmt: skip
    weight = Int8Weight({k: InMemoryWeight(v) for k, v in tensors.items()}, _fmt(qc, tmp_path), "x")
    blocks = weight.load_blocks()
    assert blocks.scale.shape == (16, 3) and torch.equal(blocks.scale[:, 0], blocks.scale[:, 2])
    assert torch.allclose(_values(weight), deq, atol=1e-6)


def test_mismatched_parts_are_a_clear_error(tmp_path):
    tensors, _ = awq_layer(torch.randn(16, 64), 32)
    tensors["scales"] = tensors["scales"][:1]
    fmt = _fmt({"quant_method": "awq", "bits": 4, "group_size": 32}, tmp_path)
    with pytest.raises(ValueError, match="x.scales has shape"):
        AwqWeight({k: InMemoryWeight(v) for k, v in tensors.items()}, fmt, "x")


def test_logical_shapes_are_the_model_weights(tmp_path):
    fmt = _fmt({"quant_method": "gptq", "bits": 4, "group_size": 128}, tmp_path)
    shapes = {"l.q_proj.qweight": (64, 256), "l.q_proj.qzeros": (4, 32),
              "l.q_proj.scales": (4, 256), "l.q_proj.g_idx": (512,), "l.q_proj.bias": (256,),
              "norm.weight": (512,)}  # fmt: skip
    assert logical_shapes(shapes, fmt) == {
        "l.q_proj.weight": (256, 512),
        "l.q_proj.bias": (256,),
        "norm.weight": (512,),
    }

"""A PEFT adapter folder is read and checked: what inferd cannot compute exactly is refused
naming the config key; requests naming an adapter are refused when LoRA is off."""

from __future__ import annotations

import math

import pytest
import torch
from lora_adapters import write_random_adapter

from inferd.engine.frontend.input_processor import InputLimits, InputProcessor
from inferd.errors import InvalidRequest
from inferd.loader.lora_adapter import load_adapter, read_adapter_config
from inferd.lora_request import LoRARequest

SHAPES = {"q_proj": (8, 6), "k_proj": (4, 6), "v_proj": (4, 6), "o_proj": (6, 8),
          "gate_proj": (10, 6), "up_proj": (10, 6), "down_proj": (6, 10)}  # fmt: skip


def adapter(tmp_path, **config):
    return write_random_adapter(tmp_path / "a", SHAPES, 2, seed=0, r=4, alpha=8,
                                extra_config=config)  # fmt: skip


def test_scale_rank_and_targets(tmp_path):
    cfg = read_adapter_config(adapter(tmp_path))
    assert (cfg.rank, cfg.scale, len(cfg.targets)) == (4, 2.0, 7)
    assert read_adapter_config(adapter(tmp_path, use_rslora=True)).scale == 8 / math.sqrt(4)
    loaded = load_adapter(tmp_path / "a", 2, SHAPES)
    a, b = loaded.weights[(1, "down_proj")]
    assert a.shape == (4, 10) and b.shape == (6, 4) and a.dtype == torch.float32


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"use_dora": True}, "use_dora"),
        ({"bias": "all"}, "bias"),
        ({"rank_pattern": {"q_proj": 8}}, "rank_pattern"),
        ({"layers_to_transform": [0]}, "layers_to_transform"),
        ({"target_modules": ["q_proj", "embed_tokens"]}, "target_modules"),
        ({"peft_type": "IA3"}, "peft_type"),
        ({"r": 0}, "r"),
        ({"fan_in_fan_out": True}, "fan_in_fan_out"),
    ],
)
def test_unsupported_configs_are_refused_by_key(tmp_path, config, key):
    with pytest.raises(InvalidRequest, match=key) as e:
        read_adapter_config(adapter(tmp_path, **config))
    assert e.value.param == "lora_request"


def test_rank_above_max_lora_rank_and_missing_files(tmp_path):
    with pytest.raises(InvalidRequest, match="max_lora_rank"):
        read_adapter_config(adapter(tmp_path), max_rank=2)
    with pytest.raises(InvalidRequest, match="adapter_config.json"):
        read_adapter_config(tmp_path / "nowhere")


def test_tensors_that_do_not_fit_the_model_are_refused(tmp_path):
    path = adapter(tmp_path)
    wrong = {**SHAPES, "q_proj": (16, 6)}
    with pytest.raises(InvalidRequest, match="q_proj"):
        load_adapter(path, 2, wrong)
    with pytest.raises(InvalidRequest, match="layers"):
        load_adapter(path, 1, SHAPES)


class _Tokenizer:
    def encode(self, text):
        return [1, 2]


def test_input_processor_checks_the_adapter(tmp_path):
    lora = {"prompt_token_ids": [1, 2], "lora_request": LoRARequest("a", 1, str(adapter(tmp_path)))}
    off = InputProcessor(_Tokenizer(), InputLimits(100, 64))
    with pytest.raises(InvalidRequest, match="enable_lora"):
        off.make_request("r", lora, _params())
    on = InputProcessor(_Tokenizer(), InputLimits(100, 64, max_lora_rank=4))
    request, _ = on.make_request("r", lora, _params())
    assert request.lora_request == lora["lora_request"]
    small = InputProcessor(_Tokenizer(), InputLimits(100, 64, max_lora_rank=2))
    with pytest.raises(InvalidRequest, match="max_lora_rank"):
        small.make_request("r", lora, _params())
    with pytest.raises(InvalidRequest, match="lora_int_id"):
        LoRARequest("a", 0, "/x")


def _params():
    from inferd.sampling_params import SamplingParams

    return SamplingParams(max_tokens=4)


def test_memory_counts_what_the_slots_allocate(tmp_path):
    from tiny_gguf import write_tiny_gguf

    from inferd.layers.lora import attach_lora
    from inferd.loader import load_model, open_checkpoint
    from inferd.memory.lora import adapter_slot_memory

    write_tiny_gguf(tmp_path / "t.gguf", "qwen3")
    checkpoint = open_checkpoint(tmp_path / "t.gguf")
    model = load_model(checkpoint, torch.float32, torch.device("cpu"))
    slots = attach_lora(model, max_loras=3, max_rank=8)
    memory = adapter_slot_memory(checkpoint.config, 3, 8)
    assert memory.slot_bytes == slots.slot_bytes() > 0
    assert memory.total_bytes == 3 * slots.slot_bytes()

"""Pre-quantised HF checkpoints (AWQ, GPTQ, compressed-tensors INT8 and FP8) agree with HF
transformers running the same weights dequantised: 8 prompts decoded together, greedy, on a
tiny random Llama whose linear layers the test quantises and packs as each format's tools do
(tests/quantized_checkpoints.py). inferd reads the packed integers into its C kernels' blocks
(never a dense copy), so this checks the unpacking, the repacking and the kernels.

Also: the default mode gives a prompt the same tokens alone and inside a batch, and the
start-up line names the format."""

from __future__ import annotations

import functools
import zlib

import pytest
import torch
from quantized_checkpoints import (
    awq_config,
    awq_layer,
    compressed_config,
    fp8_layer,
    gptq_layer,
    int8_layer,
    write_quantized,
)
from test_family_parity import PROMPTS, batched_greedy
from tiny_models import hf_greedy, make_tiny_model

from inferd.layers.block_method import BlockMethod
from inferd.loader import load_model, open_checkpoint

NEW_TOKENS = 16
# hidden 128 and MLP 256 hold whole groups of 128; head_dim 32 keeps 4 heads
SHAPE = dict(hidden_size=128, intermediate_size=256, head_dim=32)


def _gptq(bits, group, sym, act_order):
    config = {"quant_method": "gptq", "bits": bits, "group_size": group, "sym": sym,
              "desc_act": act_order}  # fmt: skip
    return (lambda key, w: gptq_layer(w, bits, group, sym, act_order, _input_seed(key))), config


def _input_seed(key: str) -> int:
    """One act-order permutation per layer input: q, k and v read the same activations (so a
    GPTQ tool sorts their inputs alike), as do gate and up."""
    for proj, shared in (("k_proj", "q_proj"), ("v_proj", "q_proj"), ("up_proj", "gate_proj")):
        key = key.replace(proj, shared)
    return zlib.crc32(key.encode())


def _int8(group, activations):
    weights = {"num_bits": 8, "type": "int", "symmetric": True,
               "strategy": "group" if group else "channel", "group_size": group}  # fmt: skip
    acts = {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True} \
        if activations else None  # fmt: skip
    return (lambda key, w: int8_layer(w, group)), compressed_config(weights, acts, "int-quantized")


def _fp8(per_channel, input_scale):
    weights = {"num_bits": 8, "type": "float", "symmetric": True,
               "strategy": "channel" if per_channel else "tensor"}  # fmt: skip
    acts = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False} \
        if input_scale else None  # fmt: skip
    return ((lambda key, w: fp8_layer(w, per_channel, input_scale)),
            compressed_config(weights, acts, "float-quantized"))  # fmt: skip


# Checkpoints whose activations are rounded too (FP8 with a static input scale)
ROUNDED_ACTIVATIONS = {"fp8-tensor-static-acts"}
FORMATS = {
    "awq-g32": ((lambda key, w: awq_layer(w, 32)), awq_config(32)),
    "awq-g128": ((lambda key, w: awq_layer(w, 128)), awq_config(128)),
    "gptq-4bit-sym-g64": _gptq(4, 64, True, False),
    "gptq-4bit-asym-act-order": _gptq(4, 32, False, True),
    "gptq-8bit-asym-g128": _gptq(8, 128, False, False),
    "gptq-8bit-sym-act-order": _gptq(8, 64, True, True),
    "int8-w8a16-channel": _int8(None, False),
    "int8-w8a8-group64": _int8(64, True),
    "fp8-channel": _fp8(True, None),
    "fp8-tensor-static-acts": _fp8(False, 0.02),
}


@functools.cache
def _folder_and_reference(kind: str, root: str):
    from pathlib import Path

    folder = Path(root) / kind
    model = make_tiny_model("llama", folder, **SHAPE)
    quantize, config = FORMATS[kind]
    write_quantized(model, folder, quantize, config)
    if kind == "fp8-tensor-static-acts":  # the checkpoint's activations: e4m3 at 0.02
        from inferd.layers.fp8_checkpoint_method import fp8_rounded

        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module is not model.lm_head:
                module.register_forward_pre_hook(lambda m, args: (fp8_rounded(args[0], 0.02),))
    expected = [hf_greedy(model, p, NEW_TOKENS)[1] for p in PROMPTS]
    return folder, expected, model


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("quantized"))


@pytest.fixture(autouse=True)
def no_user_weight_cache(tmp_path, monkeypatch):
    """The tiny folders' packed blocks go to a cache of the test's own, never the user's."""
    monkeypatch.setenv("INFERD_CACHE", str(tmp_path / "cache"))


def test_a_second_load_maps_the_packed_blocks_from_the_weight_cache(root, c_kernels,
                                                                     monkeypatch):  # fmt: skip
    from inferd.loader import weight_cache
    from inferd.loader.hf_quant_weights import AwqWeight

    folder, expected, _ = _folder_and_reference("awq-g128", root)
    first = load_model(open_checkpoint(folder), torch.float32, torch.device("cpu"))
    entries = list(weight_cache.directory().glob("*.safetensors"))
    assert len(entries) == 1  # written while the first load packed the layers

    def unpacked_again(*args, **kwargs):
        raise AssertionError("a cached start unpacked the checkpoint's integers again")

    monkeypatch.setattr(AwqWeight, "load_blocks", unpacked_again)
    second = load_model(open_checkpoint(folder), torch.float32, torch.device("cpu"))
    assert batched_greedy(second, PROMPTS, NEW_TOKENS) == expected
    assert batched_greedy(first, PROMPTS[:2], NEW_TOKENS) == expected[:2]


@pytest.mark.parametrize("kind", list(FORMATS))
def test_quantized_checkpoint_matches_hf_on_its_dequantised_weights(kind, root, c_kernels):
    folder, expected, hf_model = _folder_and_reference(kind, root)
    checkpoint = open_checkpoint(folder)
    assert checkpoint.quant is not None
    model = load_model(checkpoint, torch.float32, torch.device("cpu"))
    q_proj = model.model.layers[0].self_attn.qkv_proj
    assert q_proj.weight.numel() == 0  # no dense copy: the checkpoint's format computes
    if not kind.startswith("fp8"):
        assert isinstance(q_proj.quant_method, BlockMethod) and q_proj.quant_method.blocks
    if kind not in ROUNDED_ACTIVATIONS:
        assert batched_greedy(model, PROMPTS, NEW_TOKENS) == expected
        return
    # NOTE: activations rounded to e4m3 (3 mantissa bits): a last-bit difference upstream (a
    # norm's sum order) can move one across a rounding boundary, so a greedy path may leave
    # HF's after a few tokens; the prompts' logits must agree closely and their argmaxes too.
    got = _prompt_logits(model, PROMPTS)
    with torch.no_grad():
        want = torch.stack([hf_model(torch.tensor([p])).logits[0, -1] for p in PROMPTS])
    assert (got - want).abs().max() < 0.02 * want.abs().max()
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def _prompt_logits(model, prompts: list[list[int]]) -> torch.Tensor:
    """Each prompt's last-position logits, all prefilled in one step."""
    from inferd.engine.execution.runner import ModelRunner, SequenceStep

    per_seq = max(len(p) for p in prompts) // 4 + 1
    runner = ModelRunner(model, [per_seq * len(prompts) + 1], 4, torch.float32,
                         torch.device("cpu"))  # fmt: skip
    tables = [[list(range(1 + i * per_seq, 1 + (i + 1) * per_seq))] for i in range(len(prompts))]
    return runner.execute([SequenceStep(p, 0, t) for p, t in zip(prompts, tables)])


@pytest.mark.parametrize("kind", ["awq-g128", "gptq-4bit-asym-act-order", "int8-w8a8-group64",
                                  "fp8-tensor-static-acts"])  # fmt: skip
def test_default_mode_gives_a_prompt_the_same_tokens_alone_and_in_a_batch(kind, root, c_kernels):
    from inferd import LLM, SamplingParams

    folder, _, _ = _folder_and_reference(kind, root)
    llm = LLM(model=str(folder))  # dtype auto: the checkpoint's format, the engine's defaults
    try:
        assert llm.engine.runner.model.scheme.stored is not None
        greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        prompts = [{"prompt_token_ids": p} for p in PROMPTS]
        together = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]
        alone = [llm.generate([p], greedy)[0].outputs[0].token_ids for p in prompts[:3]]
    finally:
        llm.shutdown()
    assert alone == together[:3]

"""gpt-oss against HF transformers in float32 on a tiny random model (tests/tiny_models.py:
attention sinks, q/k/v/o biases, alternating sliding-window layers over a window shorter than
the prompts, YaRN, a router with a bias, experts with biases and the clamped SwiGLU, whose
clamps bite): 8 prompts decoded together, 32 greedy tokens each, from

* a `save_pretrained` folder (packed experts: gate and up interleaved, stored input by output);
* a folder of MXFP4 experts this test quantises and writes itself (`*_blocks`, `*_scales`,
  `quantization_config`), HF's reference built from the dequantised weights: dequantised by
  inferd (the layout, nibble order and scales), and kept as blocks (the packing and the C
  block kernel, close to the float32 run);
* GGUF files as llama.cpp's converter writes them: float32, and with MXFP4 experts quantised by
  the `gguf` package (HF's reference from its dequantised values).

And the default mode (`dtype auto`) on the MXFP4 folder and the MXFP4 GGUF file: a prompt's
greedy tokens alone equal its tokens inside a batch of all the prompts.
"""

from __future__ import annotations

import copy
import json
import random

import numpy as np
import pytest
import torch
from hf_to_gguf import write_gguf
from safetensors.torch import load_file, save_file
from test_family_parity import PROMPTS, batched_greedy
from tiny_models import hf_greedy, make_tiny_model

from inferd import LLM, SamplingParams
from inferd.engine.execution.runner import ModelRunner, SequenceStep
from inferd.layers.moe import ExpertBlocks, ExpertLinear
from inferd.layers.rotary import RotaryEmbedding
from inferd.layers.weight_scheme import WeightScheme
from inferd.loader import load_model, open_checkpoint
from inferd.models.cpu_decoder import CpuDecoder

NEW_TOKENS = 32
CPU = torch.device("cpu")
# e2m1's values in HF's MXFP4 code order (transformers' FP4_VALUES)
FP4 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])  # fmt: skip


def to_mxfp4(w: torch.Tensor):
    """[..., out, in] → HF's MXFP4 (blocks uint8 [..., out, in/32, 16], low nibble first;
    E8M0 exponents [..., out, in/32]) and the values they hold: per 32 inputs the scale that
    brings the largest within e2m1's range, each value the nearest e2m1 one."""
    groups = w.reshape(*w.shape[:-1], -1, 32)
    exp = torch.floor(torch.log2(groups.abs().amax(-1).clamp(min=2.0**-100))) - 2
    scaled = groups / torch.exp2(exp)[..., None]
    codes = (scaled[..., None] - FP4).abs().argmin(-1)
    values = (FP4[codes] * torch.exp2(exp)[..., None]).reshape(w.shape)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    return blocks, (exp + 127).to(torch.uint8), values


def _experts(model):
    return [layer.mlp.experts for layer in model.model.layers]


def logits_of_steps(model, prompts=PROMPTS[:3], decode_steps: int = 4) -> torch.Tensor:
    """Last-position logits of a prefill of `prompts`, then of `decode_steps` decode steps of
    all of them (the next token fixed: the same inputs whatever the mode)."""
    groups = len(model.config.kv_groups())
    runner = ModelRunner(model, [64] * groups, 16, torch.float32, CPU)
    tables = [[list(range(1 + 4 * i, 5 + 4 * i))] * groups for i in range(len(prompts))]
    out = [runner.execute([SequenceStep(p, 0, t) for p, t in zip(prompts, tables)])]
    for step in range(decode_steps):
        steps = [SequenceStep([10 + step], len(p) + step, t) for p, t in zip(prompts, tables)]
        out.append(runner.execute(steps))
    return torch.cat(out)


def _greedy(model) -> list[list[int]]:
    return [hf_greedy(model, p, NEW_TOKENS)[1] for p in PROMPTS]


def write_mxfp4_folder(model, folder):
    """`model` with its experts as MXFP4 (a copy), saved as a published gpt-oss folder is:
    the experts' blocks and exponents output by input, biases and every other tensor dense."""
    quantised = copy.deepcopy(model)
    parts = {}
    with torch.no_grad():
        for i, experts in enumerate(_experts(quantised)):
            for kind in ("gate_up_proj", "down_proj"):
                param = getattr(experts, kind)  # [experts, in, out]
                blocks, scales, values = to_mxfp4(param.transpose(1, 2))
                param.copy_(values.transpose(1, 2))
                name = f"model.layers.{i}.mlp.experts.{kind}"
                parts[f"{name}_blocks"], parts[f"{name}_scales"] = blocks, scales
    quantised.save_pretrained(folder, safe_serialization=True)
    (file,) = folder.glob("*.safetensors")
    dense = {name.removesuffix("_blocks") for name in parts}  # what the blocks replace
    state = {n: t for n, t in load_file(str(file)).items() if n not in dense}
    save_file({**state, **parts}, str(file), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"],
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    return quantised


def gguf_mxfp4_reference(model):
    """`model` with its experts as the `gguf` package's MXFP4 holds them (a copy), in the
    layout llama.cpp's converter quantises: gate, up and down apart, output by input."""
    import gguf
    from gguf.constants import GGMLQuantizationType as T

    def through(w: torch.Tensor) -> torch.Tensor:
        data = w.contiguous().numpy().astype(np.float32)
        return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(data, T.MXFP4),
                                                       T.MXFP4).copy())  # fmt: skip

    quantised = copy.deepcopy(model)
    with torch.no_grad():
        for experts in _experts(quantised):
            gate_up = experts.gate_up_proj.transpose(1, 2)  # [experts, 2 inter, hidden]
            mixed = torch.empty_like(gate_up)
            mixed[:, 0::2], mixed[:, 1::2] = through(gate_up[:, 0::2]), through(gate_up[:, 1::2])
            experts.gate_up_proj.copy_(mixed.transpose(1, 2))
            experts.down_proj.copy_(through(experts.down_proj.transpose(1, 2)).transpose(1, 2))
    return quantised


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The HF model, its save_pretrained folder, and HF's greedy tokens per prompt."""
    folder = tmp_path_factory.mktemp("gpt-oss")
    model = make_tiny_model("gpt_oss", folder)
    model.save_pretrained(folder, safe_serialization=True)
    return model, folder, _greedy(model)


@pytest.fixture(scope="module")
def mxfp4(tiny, tmp_path_factory):
    """The MXFP4 folder, and HF's greedy tokens of its dequantised weights."""
    folder = tmp_path_factory.mktemp("gpt-oss-mxfp4")
    make_tiny_model("gpt_oss", folder)  # the tokenizer's files
    quantised = write_mxfp4_folder(tiny[0], folder)
    return folder, _greedy(quantised)


@pytest.fixture(scope="module")
def gguf_mxfp4(tiny, tmp_path_factory):
    """A GGUF file with MXFP4 experts (and a vocabulary: an engine runs it), and HF's greedy
    tokens of the weights it holds."""
    from gguf.constants import GGMLQuantizationType as T

    path = tmp_path_factory.mktemp("gpt-oss-gguf") / "gpt-oss-mxfp4.gguf"
    write_gguf(tiny[0], "gpt_oss", path, vocab=True, experts_type=T.MXFP4)
    return path, _greedy(gguf_mxfp4_reference(tiny[0]))


def _inferd(path, scheme=None) -> list[list[int]]:
    model = load_model(open_checkpoint(path), torch.float32, CPU, scheme=scheme)
    return batched_greedy(model, PROMPTS, NEW_TOKENS)


def test_the_tiny_model_exercises_what_gpt_oss_adds(tiny):
    from tiny_models import TINY_CONFIGS

    model, _, _ = tiny
    cfg = model.config
    assert cfg.sliding_window < max(len(p) for p in PROMPTS)
    assert cfg.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert cfg.rope_parameters["rope_type"] == "yarn" and cfg.rope_parameters["factor"] > 1
    layer = model.model.layers[0]
    assert layer.self_attn.sinks.abs().mean() > 1 and layer.self_attn.o_proj.bias.abs().sum() > 0
    assert layer.mlp.experts.gate_up_proj_bias.abs().sum() > 0
    assert "swiglu_limit" not in TINY_CONFIGS["gpt_oss"][2]  # 7, which GGUF files assume


def test_save_pretrained_folder_matches_hf(tiny):
    model, folder, expected = tiny
    ckpt = open_checkpoint(folder)
    assert ckpt.config.architecture == "gpt_oss"
    assert ckpt.config.rope.scaling["rope_type"] == "yarn"
    assert _inferd(folder, WeightScheme.dense(torch.float32)) == expected
    first = torch.stack([hf_greedy(model, p, 0)[0] for p in PROMPTS[:3]])
    runner_model = load_model(ckpt, torch.float32, CPU, scheme=WeightScheme.dense(torch.float32))
    ours = logits_of_steps(runner_model, decode_steps=0)
    torch.testing.assert_close(ours, first, rtol=1e-4, atol=1e-4)


def test_mxfp4_folder_dequantised_matches_hf(mxfp4):
    folder, expected = mxfp4
    assert _inferd(folder, WeightScheme.dense(torch.float32)) == expected


def test_mxfp4_folder_keeps_blocks_and_follows_float32(mxfp4, c_kernels, monkeypatch):
    folder, _ = mxfp4
    monkeypatch.setenv("INFERD_WEIGHT_CACHE", "0")
    reference = logits_of_steps(load_model(open_checkpoint(folder), torch.float32, CPU,
                                           scheme=WeightScheme.dense(torch.float32)))  # fmt: skip
    model = _blocks_model(folder, c_kernels)
    scale = reference.abs().max()
    assert (logits_of_steps(model) - reference).abs().max() < 0.03 * scale


def _blocks_model(path, c_kernels):
    """The model with experts as blocks (built directly: the HF folder's own scheme is the
    loader's choice), checked: every expert's blocks kept, no dense copy, no C decoder."""
    scheme = WeightScheme("gguf", torch.float32, blocks=True, kernels=c_kernels)
    ckpt = open_checkpoint(path)
    with torch.no_grad():
        model = ckpt.architecture.model_class(ckpt.config, scheme)
        model.load_weights(ckpt.weights())
    experts = [m for m in model.modules() if isinstance(m, ExpertLinear)]
    assert len(experts) == 2 * ckpt.config.num_layers
    for e in experts:
        assert isinstance(e.quant_method, ExpertBlocks) and e.quant_method.blocks is not None
        assert e.weight.numel() == 0  # never a dense copy
        assert e.quant_method.blocks[0].parts[0].codebook is not None  # MXFP4's 4-bit codes
    assert model.cpu_decoder is None and CpuDecoder.for_model(model) is None
    return model.eval()


def test_gguf_float32_matches_hf(tiny, tmp_path):
    model, folder, expected = tiny
    path = write_gguf(model, "gpt_oss", tmp_path / "gpt-oss.gguf")
    ckpt = open_checkpoint(path)
    hf = open_checkpoint(folder).config
    assert ckpt.config.architecture == "gpt_oss"
    assert ckpt.config.layer_types == hf.layer_types
    assert ckpt.config.sliding_window == hf.sliding_window
    assert ckpt.config.moe == hf.moe
    gguf_rope, hf_rope = (RotaryEmbedding(16, c.rope) for c in (ckpt.config, hf))
    assert torch.equal(gguf_rope.inv_freq, hf_rope.inv_freq)  # beta defaults, truncate
    assert gguf_rope.magnitude == hf_rope.magnitude > 1
    assert _inferd(path) == expected


def test_gguf_mxfp4_experts_match_hf(gguf_mxfp4, c_kernels, monkeypatch):
    path, expected = gguf_mxfp4
    assert _inferd(path, WeightScheme.dense(torch.float32)) == expected
    monkeypatch.setenv("INFERD_WEIGHT_CACHE", "0")
    reference = logits_of_steps(load_model(open_checkpoint(path), torch.float32, CPU,
                                           scheme=WeightScheme.dense(torch.float32)))  # fmt: skip
    blocks = logits_of_steps(_blocks_model(path, c_kernels))
    assert (blocks - reference).abs().max() < 0.03 * reference.abs().max()


# --- the default mode --------------------------------------------------------------------------

LONG = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _prompts() -> list[list[int]]:
    rng = random.Random(11)
    return PROMPTS[:4] + [[1] + [rng.randrange(4, 300) for _ in range(rng.randrange(3, 40))]
                          for _ in range(4)]  # fmt: skip


@pytest.mark.parametrize("which", ["mxfp4-folder", "mxfp4-gguf"])
def test_default_mode_gives_a_prompt_the_same_tokens_alone_and_in_a_batch(
    which, mxfp4, gguf_mxfp4, c_kernels, monkeypatch
):
    monkeypatch.setenv("INFERD_WEIGHT_CACHE", "0")
    path = mxfp4[0] if which == "mxfp4-folder" else gguf_mxfp4[0]
    llm = LLM(model=str(path), kv_cache_memory=32 << 20)
    model = llm.engine.runner.model
    experts = [m for m in model.modules() if isinstance(m, ExpertLinear)]
    assert all(e.quant_method.blocks is not None for e in experts)  # the default keeps blocks
    prompts = _prompts()
    together = [o.outputs[0].token_ids for o in llm.generate(prompts, LONG, use_tqdm=False)]
    llm.engine.kv.reset_prefix_cache()
    alone = [llm.generate([p], LONG, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    assert together == alone

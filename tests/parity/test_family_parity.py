"""The families added on Architecture records agree with HF transformers in float32: 8 prompts
decoded together, 32 greedy tokens each, on tiny random checkpoints this test writes

* with `save_pretrained` (experts one tensor each, Mixtral's legacy `block_sparse_moe` names),
* in transformers 5's own packed layout (`mlp.experts.gate_up_proj` [E, 2I, H], `down_proj`
  [E, H, I]: `save_original_format=False`), for the Mixture-of-Experts families,
* as GGUF files named and laid out as llama.cpp's converter does (tests/hf_to_gguf.py).

The 8 sequences share every step, so a Mixture of Experts' steps group tokens of different
sequences by expert (a prefill of all 8, then decode steps of 8 rows)."""

from __future__ import annotations

import json

import pytest
import torch
from hf_to_gguf import write_gguf
from tiny_models import hf_greedy, make_tiny_model

from inferd.engine.execution.runner import ModelRunner, SequenceStep
from inferd.loader import load_model, open_checkpoint

PROMPTS = [
    [1, 17, 250, 33, 98, 5, 77, 120, 200, 41, 9, 63, 150, 88, 12, 230, 71, 19, 140],
    [1, 5, 6],
    [1, *range(40, 80)],
    [1, 299, 298, 297, 296],
    [1, 100, 100, 100, 100, 100, 100, 100],
    [1, 64, 128, 192, 256, 32, 96, 160, 224, 288, 16],
    [1, 7],
    [1, *range(200, 230, 2)],
]
NEW_TOKENS = 32
MOE = ["qwen3_moe", "qwen2_moe", "olmoe", "mixtral"]
DENSE = ["phi3", "mistral", "gemma2", "granite", "olmo2"]


def batched_greedy(model, prompts: list[list[int]], n: int, block_size: int = 4):
    """Every prompt prefilled in one step, then all decoded together: n greedy tokens each."""
    longest = max(len(p) for p in prompts) + n
    per_seq = longest // block_size + 1
    groups = len(model.config.kv_groups())
    runner = ModelRunner(model, [per_seq * len(prompts) + 1] * groups, block_size,
                         torch.float32, torch.device("cpu"))  # fmt: skip
    tables = [[list(range(1 + i * per_seq, 1 + (i + 1) * per_seq))] * groups
              for i in range(len(prompts))]  # fmt: skip
    seqs = [list(p) for p in prompts]
    logits = runner.execute([SequenceStep(p, 0, t) for p, t in zip(prompts, tables)])
    out: list[list[int]] = [[] for _ in prompts]
    for _ in range(n):
        tokens = logits.argmax(-1).tolist()
        for seq, new, token in zip(seqs, out, tokens):
            seq.append(token)
            new.append(token)
        steps = [SequenceStep([s[-1]], len(s) - 1, t) for s, t in zip(seqs, tables)]
        logits = runner.execute(steps)
    return out


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """kind → (the HF model, its save_pretrained folder, HF's greedy tokens per prompt)."""
    root = tmp_path_factory.mktemp("families")
    out = {}
    for kind in DENSE + MOE:
        folder = root / kind
        model = make_tiny_model(kind, folder)
        model.save_pretrained(folder, safe_serialization=True)
        tokens = [hf_greedy(model, p, NEW_TOKENS)[1] for p in PROMPTS]
        out[kind] = (model, folder, tokens)
    return out


def _inferd_tokens(path) -> list[list[int]]:
    model = load_model(open_checkpoint(path), torch.float32, torch.device("cpu"))
    return batched_greedy(model, PROMPTS, NEW_TOKENS)


@pytest.mark.parametrize("kind", DENSE + MOE)
def test_save_pretrained_checkpoint_matches_hf(references, kind):
    _, folder, expected = references[kind]
    if kind == "mixtral":  # transformers 5 still writes Mixtral's legacy names
        names = json.dumps(sorted(_tensor_names(folder)))
        assert "block_sparse_moe.experts.0.w1" in names
    assert _inferd_tokens(folder) == expected


@pytest.mark.parametrize("kind", MOE)
def test_packed_experts_checkpoint_matches_hf(references, kind, tmp_path):
    model, _, expected = references[kind]
    target = tmp_path / kind
    model.save_pretrained(target, safe_serialization=True, save_original_format=False)
    names = _tensor_names(target)
    assert "model.layers.0.mlp.experts.gate_up_proj" in names  # [E, 2I, H], one tensor
    assert not any(".experts.0." in n for n in names)
    assert _inferd_tokens(target) == expected


@pytest.mark.parametrize("kind", DENSE + MOE)
def test_gguf_file_matches_hf(references, kind, tmp_path):
    model, _, expected = references[kind]
    if kind == "qwen3_moe":  # llama.cpp's qwen3moe has no dense layers: all sparse here
        model = make_tiny_model(kind, tmp_path / "all-sparse", mlp_only_layers=[])
        expected = [hf_greedy(model, p, NEW_TOKENS)[1] for p in PROMPTS]
    if kind == "gemma2":  # llama.cpp's gemma2 files store no query_pre_attn_scalar: head_dim
        model = make_tiny_model(
            kind, tmp_path / "head-dim-scale", query_pre_attn_scalar=model.config.head_dim
        )
        expected = [hf_greedy(model, p, NEW_TOKENS)[1] for p in PROMPTS]
    path = write_gguf(model, kind, tmp_path / f"{kind}.gguf")
    ckpt = open_checkpoint(path)
    record = {"mistral": "llama"}.get(kind, kind)  # Mistral's GGUF files are "llama" files
    assert ckpt.config.architecture == record
    assert ckpt.config.layer_types == open_checkpoint(references[kind][1]).config.layer_types
    assert _inferd_tokens(path) == expected


def _tensor_names(folder) -> set[str]:
    from safetensors import safe_open

    names: set[str] = set()
    for file in folder.glob("*.safetensors"):
        names |= set(safe_open(str(file), "pt").keys())
    return names


def test_sliding_window_is_shorter_than_the_prompts():
    from tiny_models import TINY_CONFIGS

    # Phi-3, Mistral and Mixtral attend over 7 tokens, Gemma 2's sliding layers over 6: the
    # parity above must cross the window.
    for kind in ("phi3", "mistral", "mixtral", "gemma2"):
        assert TINY_CONFIGS[kind][2]["sliding_window"] < max(len(p) for p in PROMPTS)


def test_phi3_fused_gguf_tensors_keep_their_blocks_in_the_c_decoder_layer(
    references, tmp_path, monkeypatch, c_kernels
):
    """Phi-3's fused attn_qkv / ffn_up, cut into q, k, v and gate, up by rows, still hand the
    block kernels whole quantisation blocks: the gguf mode runs its decode steps in the C layer,
    close to the float32 run of the same file."""
    from test_moe_gguf_blocks import logits_of_steps

    monkeypatch.setenv("INFERD_WEIGHT_CACHE", "0")
    path = write_gguf(references["phi3"][0], "phi3", tmp_path / "phi3.gguf", quantize=True)
    reference = logits_of_steps(load_model(open_checkpoint(path), torch.float32,
                                           torch.device("cpu")))  # fmt: skip
    model = load_model(open_checkpoint(path), torch.float32, torch.device("cpu"), "gguf")
    assert model.cpu_decoder is not None
    qkv = model.model.layers[0].self_attn.qkv_proj.quant_method
    assert qkv.blocks is not None and qkv.blocks.shape == (64 + 32 + 32, 64)  # q, k, v rows
    got = logits_of_steps(model)
    assert (got - reference).abs().max() < 0.03 * reference.abs().max()

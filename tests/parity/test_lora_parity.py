"""LoRA adapters agree with HF transformers + peft in float32: each family's tiny random model
with random non-zero adapters (several ranks, targets and rslora), 4 prompts decoded together
with a different adapter (or none) per row, 12 greedy tokens each; the reference is peft's own
forward, unmerged and merged."""

from __future__ import annotations

import pytest
import torch
from hf_to_gguf import write_gguf
from lora_adapters import make_adapter, merged
from test_family_parity import PROMPTS
from tiny_models import hf_greedy, make_tiny_model

from inferd.engine.execution.runner import ModelRunner, SequenceStep
from inferd.layers.lora import attach_lora
from inferd.loader import load_model, open_checkpoint
from inferd.loader.lora_adapter import load_adapter

NEW_TOKENS = 12
PROMPTS = PROMPTS[:4]  # one row per adapter and the base model
ADAPTERS = [  # (rank, alpha, targets, rslora)
    (4, 8, None, False),
    (8, 16, ["q_proj", "v_proj"], True),
    (2, 4, ["o_proj", "down_proj", "gate_proj"], False),
]


def greedy_with_adapters(model, prompts, slots, n, block_size=4, backend=None):
    """Every prompt prefilled in one step under its adapter slot, then decoded together
    (`backend` "cpu": inferd's C attention, which the C decoder layer needs)."""
    if backend == "cpu":
        from inferd.attention.cpu_backend import CpuAttentionBackend

        backend = CpuAttentionBackend(model.scheme.kernels)
    longest = max(len(p) for p in prompts) + n
    per_seq = longest // block_size + 1
    groups = len(model.config.kv_groups())
    runner = ModelRunner(model, [per_seq * len(prompts) + 1] * groups, block_size,
                         torch.float32, torch.device("cpu"), backend)  # fmt: skip
    tables = [[list(range(1 + i * per_seq, 1 + (i + 1) * per_seq))] * groups
              for i in range(len(prompts))]  # fmt: skip
    seqs = [list(p) for p in prompts]
    steps = [SequenceStep(p, 0, t, adapter_slot=s) for p, t, s in zip(prompts, tables, slots)]
    logits = runner.execute(steps)
    out: list[list[int]] = [[] for _ in prompts]
    for _ in range(n):
        for seq, new, token in zip(seqs, out, logits.argmax(-1).tolist()):
            seq.append(token)
            new.append(token)
        steps = [SequenceStep([s[-1]], len(s) - 1, t, adapter_slot=a)
                 for s, t, a in zip(seqs, tables, slots)]  # fmt: skip
        logits = runner.execute(steps)
    return out


def _mixed_tokens(path, folders) -> tuple[list[int], list[list[int]]]:
    """(each prompt's slot, inferd's greedy tokens) of the checkpoint at `path` with the adapter
    folders in slots 1.. and the prompts spread over them and the base model."""
    model = load_model(open_checkpoint(path), torch.float32, torch.device("cpu"))
    lora = attach_lora(model, max_loras=len(folders), max_rank=8)
    for slot, folder in enumerate(folders, start=1):
        adapter = load_adapter(folder, model.config.num_layers, lora.shapes(), lora.max_rank)
        lora.load(slot, slot, adapter.weights, adapter.config.scale)
    slots = [i % (len(folders) + 1) for i in range(len(PROMPTS))]
    return slots, greedy_with_adapters(model, PROMPTS, slots, NEW_TOKENS)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "gemma3"])
def test_mixed_adapters_match_hf_peft(kind, tmp_path):
    """From the save_pretrained folder, and for Llama also from a GGUF file (llama.cpp's q/k
    row order undone: the adapter's q/k rows must land on the same rows; plain RoPE, which is
    what tests/hf_to_gguf.py writes)."""
    plain_rope = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    hf = make_tiny_model(kind, tmp_path / "base", **(plain_rope if kind == "llama" else {}))
    hf.save_pretrained(tmp_path / "base", safe_serialization=True)
    references = [[hf_greedy(hf, p, NEW_TOKENS)[1] for p in PROMPTS]]
    folders = []
    for slot, (r, alpha, targets, rslora) in enumerate(ADAPTERS, start=1):
        folder = tmp_path / f"adapter{slot}"
        peft_model = make_adapter(hf, folder, seed=slot, r=r, alpha=alpha, targets=targets,
                                  rslora=rslora, gain=3.0)  # fmt: skip
        unmerged = [hf_greedy(peft_model, p, NEW_TOKENS)[1] for p in PROMPTS]
        merged_model = merged(peft_model)
        assert [hf_greedy(merged_model, p, NEW_TOKENS)[1] for p in PROMPTS] == unmerged
        references.append(unmerged)
        folders.append(folder)
    assert all(ref != references[0] for ref in references[1:]), "adapters change the output"
    paths = [tmp_path / "base"]
    if kind == "llama":
        paths.append(write_gguf(hf, kind, tmp_path / "base.gguf"))
    for path in paths:
        slots, got = _mixed_tokens(path, folders)
        assert got == [references[s][i] for i, s in enumerate(slots)], path

"""Parity with HF transformers on tiny random checkpoints written by the test itself: prompt
logits in float32 and 32 greedy tokens, through the safetensors loader and the paged KV cache."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_models import TINY_CONFIGS, hf_greedy, make_tiny_checkpoint

from inferd.engine.execution.runner import ModelRunner, SequenceStep
from inferd.loader import load_model, open_checkpoint

PROMPT = [1, 17, 250, 33, 98, 5, 77, 120, 200, 41, 9, 63, 150, 88, 12, 230, 71, 19, 140]


def inferd_greedy(model, prompt: list[int], n: int, block_size: int = 4):
    """Prefill (in two chunks) then decode, with shuffled, non-contiguous block tables."""
    groups = len(model.config.kv_groups())
    blocks_needed = (len(prompt) + n) // block_size + 1
    runner = ModelRunner(model, [64] * groups, block_size, torch.float32, torch.device("cpu"))
    ids = list(range(1, 64))
    random.Random(0).shuffle(ids)
    tables = [ids[:blocks_needed]] * groups
    half = len(prompt) // 2
    runner.execute([SequenceStep(prompt[:half], 0, tables, needs_logits=False)])
    logits = runner.execute([SequenceStep(prompt[half:], half, tables)])
    first = logits[0].clone()
    seq, tokens = list(prompt), []
    for _ in range(n):
        token = int(logits[0].argmax())
        tokens.append(token)
        seq.append(token)
        logits = runner.execute([SequenceStep([token], len(seq) - 1, tables)])
    return first, tokens


@pytest.mark.parametrize("kind", sorted(TINY_CONFIGS))
def test_tiny_checkpoint_matches_hf(kind, tmp_path):
    import transformers

    folder = make_tiny_checkpoint(kind, tmp_path / kind)
    ckpt = open_checkpoint(folder)
    model = load_model(ckpt, torch.float32, torch.device("cpu"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    ref_logits, ref_tokens = hf_greedy(hf, PROMPT, 32)
    logits, tokens = inferd_greedy(model, PROMPT, 32)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    assert tokens == ref_tokens


def test_sliding_window_is_shorter_than_prompt():
    # The parity above must exercise the window, or it proves nothing about it.
    for kind in ("gemma3", "mistral"):
        window = TINY_CONFIGS[kind][2]["sliding_window"]
        assert window < len(PROMPT) // 2

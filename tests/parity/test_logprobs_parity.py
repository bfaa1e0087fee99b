"""Logprob parity with HF transformers on a tiny random Llama written by the test: the logprobs
the sampler reports while generating, and `prompt_logprobs`, equal `log_softmax` of HF's float32
logits at the same positions (token ids, ranks and values)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_tiny_checkpoint

from inferd.engine.execution.runner import ModelRunner, SequenceStep
from inferd.engine.sampling.sampler import Sampler, SamplingRow, make_generator, prompt_logprobs
from inferd.loader import load_model, open_checkpoint
from inferd.sampling_params import SamplingParams

PROMPT = [1, 17, 250, 33, 98, 5, 77, 120, 200, 41, 9, 63]
NEW_TOKENS = 8
TOP = 5


def assert_entry_matches(entry, token: int, ref: torch.Tensor) -> None:
    """entry: the reported {token, then TOP alternatives}; ref: HF log_softmax at that position."""
    assert next(iter(entry)) == token
    assert entry[token].logprob == pytest.approx(ref[token].item(), abs=1e-5)
    assert entry[token].rank == int((ref > ref[token]).sum()) + 1
    top = ref.topk(TOP)
    best = top.indices.tolist()
    # The chosen token first, then the alternatives in rank order.
    assert list(entry)[1:] == [t for t in best if t != token]
    for rank, (t, value) in enumerate(zip(best, top.values.tolist(), strict=True), start=1):
        assert entry[t].rank == rank
        assert entry[t].logprob == pytest.approx(value, abs=1e-5)


def test_logprobs_match_hf(tmp_path):
    import transformers

    folder = make_tiny_checkpoint("llama", tmp_path / "llama")
    model = load_model(open_checkpoint(folder), torch.float32, torch.device("cpu"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    groups = len(model.config.kv_groups())
    runner = ModelRunner(model, [64] * groups, 4, torch.float32, torch.device("cpu"))
    tables = [list(range(1, 17))] * groups
    # The prompt one token per step, so every position's logits come back (prompt logprobs).
    position_logits = [
        runner.execute([SequenceStep([t], i, tables)])[0] for i, t in enumerate(PROMPT)
    ]

    params = SamplingParams(temperature=0.8, top_p=0.95, logprobs=TOP, seed=11)
    sampler, generator = Sampler(seed=0), make_generator(11)
    out: list[int] = []
    reported = []
    logits = position_logits[-1].unsqueeze(0)
    for _ in range(NEW_TOKENS):
        result = sampler(logits, [SamplingRow(params, PROMPT, out, generator, (2,))])
        out.append(result.token_ids[0])
        reported.append(result.logprobs[0])
        logits = runner.execute([SequenceStep([out[-1]], len(PROMPT) + len(out) - 1, tables)])

    with torch.no_grad():
        hf_logits = hf(torch.tensor([PROMPT + out])).logits[0].float()
    ref = torch.log_softmax(hf_logits, dim=-1)

    for j, entry in enumerate(reported):
        assert_entry_matches(entry, out[j], ref[len(PROMPT) - 1 + j])
    assert len(set(out)) > 1  # it sampled rather than repeating one token

    prompt_entries = prompt_logprobs(torch.stack(position_logits[:-1]), PROMPT[1:], TOP)
    assert len(prompt_entries) == len(PROMPT) - 1
    for i, entry in enumerate(prompt_entries):
        assert_entry_matches(entry, PROMPT[i + 1], ref[i])

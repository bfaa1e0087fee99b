"""The embedded Gemma 3 270M: 32 greedy tokens identical to HF transformers (float32, same GGUF)
through inferd's whole engine, including a prompt longer than the 512-token sliding window.
HF's outputs are stored (gemma_reference.py; scripts/gemma_hf_reference.py regenerates them)."""

from __future__ import annotations

import pytest
import torch
from gemma_reference import GREEDY_PROMPTS, GREEDY_TOKENS, LONG

from inferd import SamplingParams


@pytest.mark.slow
def test_greedy_tokens_match_hf(gemma_llm, hf_gemma_reference):
    reference, _ = hf_gemma_reference
    tok = gemma_llm.get_tokenizer()
    ids = [tok.encode(p) for p in GREEDY_PROMPTS]
    assert ids == [r["prompt_ids"] for r in reference["greedy"]]  # what HF was given
    assert len(ids[-1]) > 512  # longer than the sliding window
    params = SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS, ignore_eos=True)
    outs = gemma_llm.generate([{"prompt_token_ids": i} for i in ids], params, use_tqdm=False)
    for out, ref in zip(outs, reference["greedy"], strict=True):
        assert len(ref["tokens"]) == GREEDY_TOKENS
        assert out.outputs[0].token_ids == ref["tokens"]


@pytest.mark.slow
def test_prompt_logits_match_hf(gemma_llm, hf_gemma_reference):
    from inferd.engine.execution.runner import ModelRunner, SequenceStep

    reference, tensors = hf_gemma_reference
    engine = gemma_llm.engine
    prompt = engine.tokenizer.encode(LONG)
    assert prompt == reference["long_prompt_ids"]  # what HF was given
    blocks = -(-len(prompt) // 16)
    groups = len(engine.runner.kv_caches)
    # A runner of its own, so the shared engine's cached blocks stay untouched.
    runner = ModelRunner(engine.runner.model, [blocks + 1] * groups, 16, torch.float32,
                         torch.device("cpu"))  # fmt: skip
    tables = [list(range(1, blocks + 1))] * groups
    logits = runner.execute([SequenceStep(prompt, 0, tables)])[0]
    ref = tensors["long_last_logits"]
    assert ref.shape == (262144,)
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=2e-4)

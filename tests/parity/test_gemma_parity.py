"""The embedded Gemma 3 270M: 32 greedy tokens identical to HF transformers (float32, same GGUF)
through inferd's whole engine, including a prompt longer than the 512-token sliding window."""

from __future__ import annotations

import pytest
import torch
from tiny_models import hf_greedy

from inferd import SamplingParams

LONG = (
    "The history of computing is a story of abstraction layered on abstraction. "
    "Engineers first wired programs by hand, then wrote them in assembly, then in compiled "
    "languages, and each step let them think about larger problems. "
) * 14 + "In one sentence, the lesson of this history is"

PROMPTS = [
    "What is CUDA?",
    "The capital of France is",
    "def fibonacci(n):\n",
    "Translate to German: The weather is nice today.",
    LONG,
]


@pytest.mark.slow
def test_greedy_tokens_match_hf(gemma_llm, hf_gemma_model):
    tok = gemma_llm.get_tokenizer()
    ids = [tok.encode(p) for p in PROMPTS]
    assert len(ids[-1]) > 512  # longer than the sliding window
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    outs = gemma_llm.generate([{"prompt_token_ids": i} for i in ids], params, use_tqdm=False)
    for prompt_ids, out in zip(ids, outs):
        _, ref = hf_greedy(hf_gemma_model, prompt_ids, 32)
        assert out.outputs[0].token_ids == ref


@pytest.mark.slow
def test_prompt_logits_match_hf(gemma_llm, hf_gemma_model):
    from inferd.engine.runner import ModelRunner, SequenceStep

    engine = gemma_llm.engine
    prompt = engine.tokenizer.encode(LONG)
    blocks = -(-len(prompt) // 16)
    groups = len(engine.runner.kv_caches)
    # A runner of its own, so the shared engine's cached blocks stay untouched.
    runner = ModelRunner(engine.runner.model, [blocks + 1] * groups, 16, torch.float32,
                         torch.device("cpu"))  # fmt: skip
    tables = [list(range(1, blocks + 1))] * groups
    logits = runner.execute([SequenceStep(prompt, 0, tables)])[0]
    with torch.no_grad():
        ref = hf_gemma_model(torch.tensor([prompt])).logits[0, -1].float()
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=2e-4)

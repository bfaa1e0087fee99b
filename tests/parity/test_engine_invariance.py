"""Engine behaviour on the embedded model (float32): batching, preemption and prefix caching
must not change greedy outputs."""

from __future__ import annotations

import random

import pytest

from inferd import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    # Mixed lengths, ordinary vocabulary ids (avoid the control-token range).
    return [
        [2] + [rng.randrange(1000, 20000) for _ in range(rng.randrange(3, 90))] for _ in range(n)
    ]


def _ids(outs):
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.slow
def test_batch_invariance(gemma_llm):
    prompts = _prompts(16)
    together = _ids(gemma_llm.generate(prompts, GREEDY, use_tqdm=False))
    gemma_llm.engine.kv.reset_prefix_cache()  # alone runs must compute, not reuse
    alone = [_ids(gemma_llm.generate([p], GREEDY, use_tqdm=False))[0] for p in prompts]
    assert together == alone


@pytest.mark.slow
def test_preemption_gives_the_same_outputs(gemma_llm):
    prompts = _prompts(8, seed=1)
    reference = _ids(gemma_llm.generate(prompts, GREEDY, use_tqdm=False))
    from inferd.memory.kv import block_bytes

    cfg = gemma_llm.engine.model_config
    one_block_per_group = sum(block_bytes(cfg, len(layers), 16, 4) for _, layers in cfg.kv_groups())
    # 26 usable blocks of 16 tokens per group (+ the null block): 8 sequences of up to 106
    # tokens need up to 56 at once, so running them forces preemption.
    tight = LLM(
        dtype="float32",
        kv_cache_memory=27 * one_block_per_group,
        max_model_len=256,
        enable_prefix_caching=False,
        max_num_batched_tokens=256,
    )
    outs = tight.generate(prompts, GREEDY, use_tqdm=False)
    assert tight.engine.stats().num_preemptions > 0
    assert _ids(outs) == reference


@pytest.mark.slow
def test_prefix_cache_skips_shared_prompt_and_keeps_output(gemma_llm):
    engine = gemma_llm.engine
    shared = _prompts(1, seed=2)[0] * 3  # ~100-250 tokens
    first = gemma_llm.generate([shared + [500, 600]], GREEDY, use_tqdm=False)
    before = engine.stats()
    second = gemma_llm.generate([shared + [700]], GREEDY, use_tqdm=False)
    after = engine.stats()
    computed = after.prompt_tokens - before.prompt_tokens
    assert after.prefix_cache_hits - before.prefix_cache_hits >= len(shared) - 16
    assert computed <= 16 + 1
    engine.kv.reset_prefix_cache()
    fresh = gemma_llm.generate([shared + [700]], GREEDY, use_tqdm=False)
    assert _ids(second) == _ids(fresh)
    assert first[0].num_cached_tokens < second[0].num_cached_tokens

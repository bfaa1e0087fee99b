"""The infill sampler (engine/sampling/infill_sampler.py) in the engine, in the default mode: a
seeded request gets the same tokens alone and in a batch with other requests (infill or not),
on a tiny random checkpoint with Qwen2.5-Coder's FIM tokens, whose engine reads token texts from
its own vocabulary."""

from __future__ import annotations

import pytest
from tiny_models import make_tiny_checkpoint

from inferd import LLM, SamplingParams


@pytest.fixture(scope="module")
def fim_llm(tmp_path_factory):
    folder = make_tiny_checkpoint("llama", tmp_path_factory.mktemp("fim") / "llama", fim=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("INFERD_WEIGHT_CACHE", "0")
        return LLM(model=str(folder), kv_cache_memory=16 << 20, max_model_len=128)


def test_a_seeded_infill_request_gets_the_same_tokens_alone_and_in_a_batch(fim_llm):
    # A random model spreads its mass thin (the filter would end every reply at once): three
    # favoured tokens give it candidates above its thresholds to choose from.
    favoured = {40: 6.0, 41: 6.0, 42: 6.0}
    params = SamplingParams(top_k=40, top_p=0.99, seed=21, max_tokens=10, infill_sampler=True,
                            logit_bias=favoured)  # fmt: skip
    prompt = [1, 4, 50, 60, 5, 70, 6]  # <|fim_prefix|> .. <|fim_suffix|> .. <|fim_middle|>
    alone = fim_llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
    crowd = [[1, 9, 9, 9], prompt, [1, 100, 120, 140, 160], [1, 4, 80, 5, 6]]
    others = [
        SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True),
        params,
        SamplingParams(temperature=0.5, seed=5, max_tokens=10, ignore_eos=True),
        params.with_changes(seed=3),
    ]
    together = fim_llm.generate(crowd, others, use_tqdm=False)[1].outputs[0].token_ids
    assert together == alone
    assert set(alone) <= set(favoured) | {2} and len(set(alone)) > 1  # it samples among them

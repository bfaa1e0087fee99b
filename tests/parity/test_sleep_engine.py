"""Sleep and wake in a whole engine (a tiny random GGUF model, token ids in and out): after a sleep
of level 1 (the KV pool freed) or 2 (the weights too) and a wake, greedy tokens are exactly those
before; while asleep requests are refused, and a sleep is refused while a request is unfinished;
the KV tier keeps serving blocks after a wake although the pool's prefix cache is gone."""

from __future__ import annotations

import weakref

import pytest
from tiny_gguf import tiny_llama_llm

from inferd import SamplingParams
from inferd.errors import InvalidRequest, ModelAsleep, RequestsRunning

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPT = list(range(5, 45))  # 40 tokens: two full blocks of 16 to name, cache and save


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    with tiny_llama_llm(tmp_path_factory.mktemp("tiny"), kv_cache_memory=16 << 20,
                        kv_offload_memory=8 << 20) as llm:  # fmt: skip
        yield llm


def _tokens(llm, prompt=PROMPT):
    out = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
    return out.outputs[0].token_ids, out.num_cached_tokens


def test_level_1_frees_the_pool_and_a_wake_gives_the_same_tokens_from_the_tier(llm):
    engine = llm.engine
    before, _ = _tokens(llm)
    engine.connector.flush()  # the prompt's blocks are in the RAM tier
    pool_bytes = engine.runner.kv_cache_bytes()
    cache = weakref.ref(engine.runner.kv_caches[0][0])
    answer = llm.sleep(1)
    assert cache() is None  # nothing (the C decoder's pool addresses) keeps the pool alive
    assert answer["level"] == 1 and answer["freed_bytes"] == pool_bytes > 0
    assert answer["rss_before"] > 0 and answer["rss_after"] > 0
    assert llm.is_sleeping() and engine.runner.kv_cache_bytes() == 0
    assert engine.stats().sleep_level == 1
    pool = engine.kv.pools[0]
    assert not pool.cached and all(pool.untouched[1:])  # zeroed again on first use
    with pytest.raises(ModelAsleep, match="asleep"):
        llm.generate([PROMPT], GREEDY, use_tqdm=False)
    assert llm.sleep(1)["freed_bytes"] == 0  # asleep already: nothing more to free
    loaded = engine.stats().kv_blocks_loaded
    assert llm.wake_up()["level"] == 1 and not llm.is_sleeping()
    assert engine.runner.kv_cache_bytes() == pool_bytes
    after, cached = _tokens(llm)
    assert after == before
    # The pool's cache went with the sleep; the tier still had the prompt's two blocks.
    stats = engine.stats()
    assert (cached, stats.kv_blocks_loaded - loaded) == (32, 2), stats
    assert llm.wake_up()["level"] == 0  # awake already: nothing to do


def test_level_2_drops_the_weights_and_a_wake_reloads_them(llm):
    other = list(range(100, 130))
    before = [_tokens(llm, p)[0] for p in (PROMPT, other)]
    weights = sum(p.numel() * p.element_size() for p in llm.engine.runner.model.parameters())
    pool_bytes = llm.engine.runner.kv_cache_bytes()
    answer = llm.sleep(2)
    assert answer["level"] == 2 and llm.engine.runner.model is None
    assert answer["freed_bytes"] >= weights + pool_bytes  # + buffers (norm gains, tables)
    woke = llm.wake_up()
    assert woke["level"] == 2 and woke["seconds"] > 0
    assert [_tokens(llm, p)[0] for p in (PROMPT, other)] == before


def test_a_sleep_is_refused_while_a_request_is_unfinished_and_it_runs_on(llm):
    alone, _ = _tokens(llm)
    engine = llm.engine
    engine.add_request("busy", {"prompt_token_ids": PROMPT}, GREEDY)
    with pytest.raises(RequestsRunning, match="1 request"):
        llm.sleep(1)
    assert not llm.is_sleeping()
    final = None
    while engine.has_unfinished_requests():
        final = next((o for o in engine.step() if o.finished), final)
    assert final.outputs[0].token_ids == alone
    for bad in (0, 3, True):
        with pytest.raises(InvalidRequest, match="level must be 1 or 2"):
            llm.sleep(bad)

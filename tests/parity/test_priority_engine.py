"""Priority scheduling and the queue deadline in a whole engine (a tiny random GGUF model, token ids
in and out): a high-priority arrival preempts a running low-priority request, whose greedy
tokens are still exactly those it gets alone (recomputed through the prefix cache); a request
that waited past max_queue_time unscheduled ends with "queue_timeout" and an error saying so."""

from __future__ import annotations

import random
import time
from dataclasses import replace

import pytest
from tiny_gguf import VOCAB, tiny_llama_llm

from inferd import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    with tiny_llama_llm(tmp_path_factory.mktemp("tiny"), kv_cache_memory=16 << 20,
                        max_num_seqs=2, scheduling_policy="priority",
                        max_queue_time=60.0) as llm:  # fmt: skip
        yield llm


def _prompts(n: int) -> list[list[int]]:
    rng = random.Random(11)
    return [[rng.randrange(3, VOCAB) for _ in range(rng.randrange(20, 40))] for _ in range(n)]


def test_a_preempted_request_keeps_its_greedy_tokens(llm):
    engine = llm.engine
    prompts = _prompts(3)
    alone = [llm.generate([p], GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    engine.core.kv.reset_prefix_cache()  # the run below computes, as it would the first time
    before = engine.stats().num_preemptions
    for i in range(2):  # two low-priority requests fill both sequence slots
        engine.add_request(f"low-{i}", {"prompt_token_ids": prompts[i], "priority": 5}, GREEDY)
    finals = {}
    for _ in range(4):
        finals |= {o.request_id: o for o in engine.step() if o.finished}
    engine.add_request("high", {"prompt_token_ids": prompts[2], "priority": 0}, GREEDY)
    order = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
                order.append(out.request_id)
    assert engine.stats().num_preemptions > before
    assert order.index("high") < order.index("low-1")  # it took the seat of the newest one
    tokens = [finals[r].outputs[0].token_ids for r in ("low-0", "low-1", "high")]
    assert tokens == alone


def test_a_request_past_the_queue_deadline_ends_unscheduled(llm):
    engine = llm.engine
    stale = time.monotonic() - 120  # it arrived two minutes ago, past max_queue_time (60 s)
    engine.add_request("stale", {"prompt_token_ids": _prompts(1)[0]}, GREEDY, arrival_time=stale)
    (out,) = engine.step()
    assert out.finished and out.outputs[0].finish_reason == "queue_timeout"
    assert out.outputs[0].token_ids == [] and "--max-queue-time" in out.error
    assert engine.stats().num_queue_timeouts == 1 and not engine.has_unfinished_requests()


def test_a_nonzero_priority_is_refused_under_fcfs(llm, monkeypatch):
    inputs = llm.engine.inputs  # as an engine started with the default policy checks them
    monkeypatch.setattr(inputs, "limits", replace(inputs.limits, scheduling_policy="fcfs"))
    with pytest.raises(ValueError, match="--scheduling-policy priority"):
        llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False, priority=[1])
    with pytest.raises(ValueError, match="one integer per prompt"):
        llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False, priority=[0, 0])

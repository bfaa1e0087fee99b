"""The background lane (engine/scheduling/background_lane.py), driven as test_scheduler.py drives
the scheduler (fabricated runner outputs, every record checked against a device side): a
background prompt takes at most BACKGROUND_PREFILL_TOKENS a step, none in a step that computes an
interactive prompt, and waits while an interactive request waits; its decodes keep running; and
nothing is starved or deadlocked, under fcfs and priority alike."""

from __future__ import annotations

import pytest
from test_scheduler import (
    BS,
    EOS,
    ROOT,
    CheckedScheduler,
    free_blocks,
    make_request,
    run_all,
    run_step,
)

from inferd.engine.scheduling.background_lane import BACKGROUND_PREFILL_TOKENS as CHUNK
from inferd.engine.scheduling.kv_cache import KVCacheManager
from inferd.engine.scheduling.request import SequenceStatus


def make(policy="fcfs", num_blocks=64, max_seqs=8, budget=64):
    kv = KVCacheManager([None], [num_blocks], BS, True)
    return kv, CheckedScheduler(kv, max_seqs, budget, 256, (EOS,), ROOT, policy=policy)


def add(sched, prompt, background=False, max_tokens=4, priority=0):
    req = make_request(prompt, max_tokens=max_tokens)
    req.background, req.priority = background, priority
    sched.add_request(req)
    return req.sequences[0]


def rows(out, sched):
    """{sequence id: tokens it takes} of a step record."""
    return {r.seq_id: r.num_new_tokens for r in out.rows}


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_a_background_prompt_is_computed_a_few_tokens_a_step(policy):
    kv, sched = make(policy)
    bg = add(sched, list(range(10, 10 + 3 * CHUNK + 1)), background=True)
    steps = 0
    while not bg.prefill_done:
        out, _ = run_step(sched)
        assert rows(out, sched)[bg.seq_id] <= CHUNK
        steps += 1
    assert steps == 4  # 3 * CHUNK + 1 tokens
    assert run_all(sched) == [bg.request.request_id]


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_an_interactive_prompt_takes_its_step_alone_but_for_decodes(policy):
    kv, sched = make(policy)
    decoding = add(sched, [5] * CHUNK, background=True, max_tokens=20)
    run_step(sched)  # its whole prompt: nothing else to share the step with
    prefilling = add(sched, list(range(100, 100 + 4 * CHUNK)), background=True)
    out, _ = run_step(sched)
    assert rows(out, sched) == {decoding.seq_id: 1, prefilling.seq_id: CHUNK}
    interactive = add(sched, list(range(200, 240)), max_tokens=3)
    out, _ = run_step(sched)
    # The background decode runs; the background prompt waits for the interactive one.
    assert rows(out, sched) == {decoding.seq_id: 1, interactive.seq_id: 40}
    out, _ = run_step(sched)
    assert rows(out, sched) == {decoding.seq_id: 1, interactive.seq_id: 1, prefilling.seq_id: CHUNK}
    assert set(run_all(sched)) == {
        s.request.request_id for s in (decoding, prefilling, interactive)
    }


def test_under_fcfs_a_waiting_background_request_lets_interactive_ones_pass():
    kv, sched = make("fcfs")
    bg = add(sched, list(range(10, 30)), background=True)
    interactive = add(sched, list(range(40, 60)))
    out, _ = run_step(sched)
    assert rows(out, sched) == {interactive.seq_id: 20}
    assert bg.status is SequenceStatus.WAITING and list(sched.waiting) == [bg]
    out, _ = run_step(sched)  # the interactive request decodes: the lane opens
    assert rows(out, sched) == {interactive.seq_id: 1, bg.seq_id: CHUNK}


def test_background_prompts_are_computed_one_at_a_time():
    kv, sched = make("fcfs")
    first = add(sched, list(range(10, 10 + 2 * CHUNK)), background=True)
    second = add(sched, list(range(50, 50 + 2 * CHUNK)), background=True)
    out, _ = run_step(sched)
    assert rows(out, sched) == {first.seq_id: CHUNK}
    out, _ = run_step(sched)
    assert rows(out, sched) == {first.seq_id: CHUNK}
    out, _ = run_step(sched)
    assert rows(out, sched) == {first.seq_id: 1, second.seq_id: CHUNK}


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_no_deadlock_when_a_paused_background_prompt_holds_the_only_seat(policy):
    kv, sched = make(policy, max_seqs=1)
    start = free_blocks(kv)
    bg = add(sched, list(range(10, 10 + 3 * CHUNK)), background=True, priority=5)
    run_step(sched)
    interactive = add(sched, list(range(100, 120)))
    finished = run_all(sched)
    assert set(finished) == {bg.request.request_id, interactive.request.request_id}
    if policy == "priority":  # the interactive request took the background one's seat
        assert finished[0] == interactive.request.request_id
    assert free_blocks(kv) == start


def test_a_tight_pool_finishes_every_request_of_both_lanes():
    # 13 usable blocks of 4 tokens: preemptions in both lanes, everyone finishes, nothing leaks.
    kv, sched = make("fcfs", num_blocks=14)
    start = free_blocks(kv)
    seqs = [add(sched, [100 + i] * 12, background=i % 2 == 0, max_tokens=4) for i in range(6)]
    assert sorted(run_all(sched)) == sorted(s.request.request_id for s in seqs)
    assert free_blocks(kv) == start


def test_a_batch_line_reaches_the_engine_in_the_background_lane():
    import asyncio

    from inferd.server.batches.in_process import call_app
    from inferd.server.generation.serving import BACKGROUND, RequestGroup

    added = []

    class Client:  # the EngineClient's add_request, recorded
        async def add_request(self, request_id, prompt, params, queue, arrival):
            added.append(prompt)

    async def app(scope, receive, send):  # a route: one group per request, as ServerState.admit
        group = RequestGroup(Client(), background=scope.get(BACKGROUND, False))
        await group.submit("cmpl-1", [{"prompt_token_ids": [5, 6]}], None, 0.0)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    status, _ = asyncio.run(call_app(app, "/v1/completions", b"{}", [], asyncio.Event()))
    assert status == 200 and added == [{"prompt_token_ids": [5, 6], "background": True}]
    asyncio.run(app({"type": "http"}, None, _discard))  # an HTTP client's request: interactive
    assert added[1] == {"prompt_token_ids": [5, 6]}


async def _discard(message):
    pass

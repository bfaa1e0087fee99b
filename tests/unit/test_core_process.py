"""The engine core in its own process, on a tiny random model: `LLM(engine_core_process=True)`
gives what the in-process engine gives (greedy, seeded samples, stop strings, logprobs, a bad
grammar refused); the server's client with two replicas routes, aborts, and when a replica is
killed fails only that replica's requests, then, with none left, fails everything and calls
`on_dead`; no process is left behind."""

from __future__ import annotations

import asyncio
import os
import signal

import psutil
import pytest
from tiny_models import make_tiny_checkpoint

from inferd import LLM, SamplingParams
from inferd.config import EngineConfig
from inferd.engine.frontend.async_core_client import AsyncCoreClient
from inferd.engine_snapshot import EngineSnapshot
from inferd.errors import EngineDeadError, InvalidRequest

PROMPTS = [[1, 17, 250, 33, 98, 5, 77], [1, 5, 6], [1] + list(range(40, 80))]
KW = dict(dtype="float32", kv_cache_memory=16 << 20, max_model_len=128)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_checkpoint("llama", tmp_path_factory.mktemp("tiny") / "llama")


def children() -> list[psutil.Process]:
    """This process's children, but multiprocessing's resource tracker (started with the first
    spawned process, it lives as long as this one)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if not any("resource_tracker" in part for part in p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def test_a_core_process_gives_the_in_process_engines_outputs(folder):
    before = {p.pid for p in children()}
    free = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    here = LLM(model=str(folder), **KW)
    text = here.generate([PROMPTS[2]], free, use_tqdm=False)[0].outputs[0].text
    stop = text[len(text) // 2 :][:2]  # a stop string from the middle of its greedy text
    params = [
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=1.0, seed=7, n=2, max_tokens=10, ignore_eos=True),
        free.with_changes(stop=[stop]),
    ]
    expected = here.generate(PROMPTS, params, use_tqdm=False)
    here.shutdown()
    there = LLM(model=str(folder), engine_core_process=True, **KW)
    try:
        assert len(children()) > len(before)  # the core runs in a process of its own
        got = there.generate(PROMPTS, params, use_tqdm=False)
        for a, b in zip(got, expected, strict=True):
            assert [(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in a.outputs] == [
                (c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in b.outputs
            ]
            # NOTE: to float32 rounding: the core steps as requests arrive, so the batches (and
            # the GEMMs' reduction order) may differ from the in-process run's.
            for x, y in zip(a.outputs[0].logprobs or [], b.outputs[0].logprobs or [], strict=True):
                assert list(x) == list(y) and all(
                    abs(x[t].logprob - y[t].logprob) < 1e-5
                    and x[t].decoded_token == y[t].decoded_token
                    for t in x
                )
        assert expected[2].outputs[0].finish_reason == "stop"  # the stop string did stop it
        bad = SamplingParams(max_tokens=4, structured_outputs={"regex": "("})
        with pytest.raises(InvalidRequest):
            there.generate([PROMPTS[0]], bad, use_tqdm=False)
        again = there.generate([PROMPTS[0]], params[0], use_tqdm=False)[0]
        assert again.outputs[0].token_ids == expected[0].outputs[0].token_ids  # it serves on
    finally:
        there.shutdown()
    assert {p.pid for p in children()} <= before


async def _collect(client, rid, prompt, params):
    queue: asyncio.Queue = asyncio.Queue()
    await client.add_request(rid, {"prompt_token_ids": prompt}, params, queue)
    while True:
        item = await asyncio.wait_for(queue.get(), 60)
        if isinstance(item, BaseException) or item.finished:
            return item


def test_replicas_route_abort_and_fail_alone(folder):
    before = {p.pid for p in children()}
    config = EngineConfig(model=str(folder), **KW)
    client = AsyncCoreClient(config, data_parallel_size=2, routing="round-robin")
    client.launch()
    dead_calls = []
    client.on_dead = lambda: dead_calls.append(True)
    long = SamplingParams(temperature=0, max_tokens=80, ignore_eos=True)
    short = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)

    async def body():
        client.start()
        observed = []
        client.observe_outputs(lambda out: out.finished and observed.append(out))
        done = await asyncio.gather(*(_collect(client, f"a{i}", p, short)
                                      for i, p in enumerate(PROMPTS + PROMPTS)))  # fmt: skip
        assert all(o.finished and len(o.outputs[0].token_ids) == 6 for o in done)
        steps = [s.steps for s in client.replica_stats()]
        assert all(n > 0 for n in steps)  # round-robin: both replicas served
        # The dashboard's snapshot crosses the process boundary typed: the first replica's.
        snap = await client.snapshot()
        assert isinstance(snap, EngineSnapshot) and snap.settings.max_model_len == 128
        assert snap.counters.steps >= steps[0] > 0 and snap.num_running == 0
        # An abort reaches the core and ends the request there.
        queue: asyncio.Queue = asyncio.Queue()
        await client.add_request("gone", {"prompt_token_ids": PROMPTS[2]}, long, queue)
        await queue.get()
        client.abort("gone")
        for _ in range(100):
            if any(o.request_id == "gone" for o in observed):
                break
            await asyncio.sleep(0.05)
        aborted = next(o for o in observed if o.request_id == "gone")
        assert (
            aborted.outputs[0].finish_reason == "abort" and len(aborted.outputs[0].token_ids) < 80
        )
        # Kill replica 1 mid-run: its requests fail, replica 0's finish.
        queues = {}
        for i in range(4):
            queues[f"b{i}"] = asyncio.Queue()
            await client.add_request(
                f"b{i}", {"prompt_token_ids": PROMPTS[0]}, long, queues[f"b{i}"]
            )
        owner = {rid: client.replicas.index(client._replica_of[rid]) for rid in queues}
        os.kill(client.replicas[1].process.process.pid, signal.SIGKILL)
        results = {}
        for rid, q in queues.items():
            while True:
                item = await asyncio.wait_for(q.get(), 60)
                if isinstance(item, BaseException) or item.finished:
                    results[rid] = item
                    break
        for rid, item in results.items():
            if owner[rid] == 1:
                assert isinstance(item, EngineDeadError)
            else:
                assert item.finished and len(item.outputs[0].token_ids) == 80
        assert client.health() is None and not dead_calls  # one replica still serves
        assert (await client.snapshot()).counters.steps > 0  # the live one answers
        assert (await _collect(client, "c", PROMPTS[1], short)).finished  # routed around
        # The last replica dies: everything fails, /health says why, on_dead is called.
        os.kill(client.replicas[0].process.process.pid, signal.SIGKILL)
        for _ in range(100):
            if dead_calls:
                break
            await asyncio.sleep(0.05)
        assert dead_calls and "exited" in client.health()
        with pytest.raises(EngineDeadError):
            await client.add_request("d", {"prompt_token_ids": [1]}, short, asyncio.Queue())
        with pytest.raises(EngineDeadError):
            await client.snapshot()

    try:
        asyncio.run(body())
    finally:
        client.stop(10)
    assert {p.pid for p in children()} <= before


@pytest.mark.slow
def test_tensor_parallelism_runs_inside_the_core_process(folder):
    before = {p.pid for p in children()}
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    one = LLM(model=str(folder), **KW)
    expected = [o.outputs[0].token_ids for o in one.generate(PROMPTS, greedy, use_tqdm=False)]
    one.shutdown()
    two = LLM(model=str(folder), engine_core_process=True, tensor_parallel_size=2, **KW)
    try:
        got = [o.outputs[0].token_ids for o in two.generate(PROMPTS, greedy, use_tqdm=False)]
        assert got == expected
        reports = two.rank_reports()
        assert [r["rank"] for r in reports] == [0, 1]
        assert (
            os.getpid() not in {r["pid"] for r in reports} and len({r["pid"] for r in reports}) == 2
        )
    finally:
        two.shutdown()
    assert {p.pid for p in children()} <= before  # the core stopped its workers

"""The dashboard's engine snapshot (inferd/engine/core/dashboard_view.py): the KV blocks' states
and owners and the requests' states and timelines, read from a scheduler driven with fabricated
outputs (milliseconds); then one whole snapshot of a real engine on a tiny Gemma 3 checkpoint
(sliding and full-attention groups, memory and its prediction), and through AsyncEngine; and the
KV tiers' figures of an engine that keeps some, served in-process (/kv/clear, /metrics)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import torch
from test_scheduler import BS, add, make, run_all, run_step
from tiny_models import make_tiny_checkpoint

from inferd import LLM, SamplingParams
from inferd.engine.core.dashboard_memory import memory_snapshot
from inferd.engine.core.dashboard_view import SnapshotBuilder, _Places, kv_groups, request_snapshot
from inferd.engine.frontend.async_core_client import _typed
from inferd.engine.frontend.async_engine import AsyncEngine
from inferd.engine.transport import ipc
from inferd.engine_client import SnapshotClient
from inferd.engine_snapshot import (
    BLOCK_CACHED,
    BLOCK_FREE,
    BLOCK_NULL,
    BLOCK_SHARED,
    BLOCK_USED,
    EngineSnapshot,
)
from inferd.errors import InvalidRequest


def groups(kv, sched):
    return kv_groups(kv, sched, [1] * len(kv.pools), [100] * len(kv.pools))


def requests(sched, now=10.0):
    places = _Places(sched)
    return {r.request_id: request_snapshot(r, places, now) for r in sched.requests.values()}


def test_blocks_in_use_belong_to_their_requests_and_finished_ones_stay_cached():
    kv, sched = make(num_blocks=16)
    a = add(sched, list(range(10, 19)), max_tokens=2)  # 9 tokens: 3 blocks of 4
    b = add(sched, list(range(40, 45)), max_tokens=2)  # 5 tokens: 2 blocks
    run_step(sched)
    (g,) = groups(kv, sched)
    assert len(g.blocks) == 16 and g.blocks[0] == BLOCK_NULL
    assert g.owners == {a.request.request_id: a.block_tables[0], b.request.request_id:
                        b.block_tables[0]}  # fmt: skip
    held = set(a.block_tables[0]) | set(b.block_tables[0])
    assert {i for i, s in enumerate(g.blocks) if s == BLOCK_USED} == held
    assert g.count(BLOCK_FREE) == 16 - 1 - len(held)

    run_all(sched)
    (g,) = groups(kv, sched)
    # Every full block computed stays findable for prefix reuse; the partial ones are free.
    full = (9 + 2 - 1) // BS + (5 + 2 - 1) // BS
    assert g.owners == {} and g.count(BLOCK_CACHED) == full
    assert g.count(BLOCK_USED) == g.count(BLOCK_SHARED) == 0


def test_without_prefix_caching_freed_blocks_are_plain_free():
    kv, sched = make(num_blocks=16, caching=False)
    add(sched, list(range(10, 19)), max_tokens=2)
    run_all(sched)
    (g,) = groups(kv, sched)
    assert g.blocks == BLOCK_NULL + BLOCK_FREE * 15


def test_a_shared_prefix_shows_as_shared_blocks_held_by_both_requests():
    kv, sched = make(num_blocks=32)
    prefix = list(range(10, 18))  # two full blocks
    first = add(sched, prefix + [50, 51], max_tokens=4)
    run_step(sched)  # prefilled: its full blocks are registered
    second = add(sched, prefix + [60, 61], max_tokens=4)
    run_step(sched)
    (g,) = groups(kv, sched)
    shared = [i for i, s in enumerate(g.blocks) if s == BLOCK_SHARED]
    assert shared == sorted(first.block_tables[0][:2]) == sorted(second.block_tables[0][:2])
    assert requests(sched)[second.request.request_id].cached_prompt_tokens == 2 * BS


def test_a_sliding_group_holds_only_its_window():
    kv, sched = make(num_blocks=32, windows=(None, 8), budget=64)
    seq = add(sched, list(range(10, 50)), max_tokens=4)  # 40 tokens: 10 blocks
    run_step(sched), run_step(sched)  # the prefill, then a decode that drops what left the window
    full, sliding = groups(kv, sched)
    assert full.window is None and sliding.window == 8
    rid = seq.request.request_id
    assert full.owners[rid] == seq.block_tables[0] and len(full.owners[rid]) == 11  # 41 tokens
    # The window (8 tokens) reaches back into at most 3 blocks; the table's older entries are
    # the null block and are not listed as held.
    assert len(sliding.owners[rid]) <= 3 and sliding.count(BLOCK_USED) == len(sliding.owners[rid])


def test_request_states_and_timeline_follow_the_schedule():
    kv, sched = make(num_blocks=64, budget=8, max_seqs=1)
    long = add(sched, list(range(10, 30)), max_tokens=3)  # 20 tokens: 3 steps of prefill
    queued = add(sched, list(range(40, 45)), max_tokens=3)  # no seat: max_seqs=1
    run_step(sched)
    snaps = requests(sched, now=5.0)
    first = snaps[long.request.request_id]
    assert (first.state, first.computed_tokens, first.prompt_tokens) == ("prefill", 8, 20)
    assert [e for e, _ in first.events] == ["arrived", "queued", "scheduled"]
    assert snaps[queued.request.request_id].state == "queued"
    assert first.age_s == pytest.approx(5.0)  # arrival_time is 0.0 in these requests
    run_step(sched), run_step(sched)
    first = requests(sched)[long.request.request_id]
    assert first.state == "decode" and first.output_tokens == 1
    assert [e for e, _ in first.events][-1] == "first_token"
    assert first.blocks == len(long.block_tables[0])


def test_a_preempted_request_shows_as_preempted_with_its_preemption_stamped():
    kv, sched = make(num_blocks=5, budget=16)  # 4 usable blocks of 4 tokens
    old = add(sched, list(range(10, 17)), max_tokens=8)  # 7 tokens: 2 blocks, grows to 4
    young = add(sched, list(range(20, 27)), max_tokens=8)
    for _ in range(3):
        run_step(sched)
    snaps = requests(sched)
    victim = snaps[young.request.request_id]
    assert victim.state == "preempted" and victim.preemptions == 1 and victim.blocks == 0
    assert "preempted" in [e for e, _ in victim.events]
    assert snaps[old.request.request_id].state == "decode"


def assert_plain(value, where="snapshot"):
    """Only JSON's kinds of value: nothing of the engine's objects (or torch's) inside."""
    if isinstance(value, dict):
        for k, v in value.items():
            assert isinstance(k, str), f"{where}: key {k!r}"
            assert_plain(v, f"{where}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            assert_plain(v, f"{where}[{i}]")
    else:
        assert value is None or type(value) in (bool, int, float, str), f"{where}: {value!r}"


@pytest.fixture(scope="module")
def gemma_folder(tmp_path_factory):
    return make_tiny_checkpoint("gemma3", tmp_path_factory.mktemp("tiny") / "gemma3")


TINY = dict(dtype="float32", kv_cache_memory=1 << 20, max_model_len=64, max_num_batched_tokens=32)


@pytest.fixture(scope="module")
def tiny_gemma(gemma_folder):
    return LLM(model=str(gemma_folder), **TINY)


def test_a_whole_snapshot_of_an_engine_is_plain_data(tiny_gemma):
    engine = tiny_gemma.engine
    engine.add_request("watched", list(range(5, 25)), SamplingParams(max_tokens=30,
                                                                     ignore_eos=True))  # fmt: skip
    engine.step(), engine.step()
    snap = SnapshotBuilder()(engine)
    try:
        assert [g.window for g in snap.kv] == [None, 6] and sum(g.num_layers for g in snap.kv) == 3
        assert [len(g.blocks) for g in snap.kv] == engine.setup.kv_plan.num_blocks
        (req,) = snap.requests
        assert (req.request_id, req.state, snap.num_running) == ("watched", "decode", 1)
        assert snap.counters.prompt_tokens == 20 and snap.counters.steps == 2
        kinds = {s.kind: s for s in snap.steps}
        assert kinds["prefill"].steps == 1 and kinds["decode"].steps == 1
        assert set(kinds["decode"].phase_seconds) == set(snap.last_step) - {"step"}
        m = snap.memory
        assert m.kv_pool == engine.runner.kv_cache_bytes() and m.weights > 0
        assert m.rss is not None and m.rss >= m.weights
        assert m.predicted is not None and m.predicted.kv_pool == m.kv_pool
        assert m.predicted.weights > 0 and m.predicted.activations > 0
        assert snap.kv_tiers == [] and snap.kv_connector == {}  # no tiers: the panel hides
        counted = snap.efficiency["kinds"]  # bytes and FLOPs, whether or not peaks are known
        assert counted["decode"]["steps"] == counted["prefill"]["steps"] == 1
        assert counted["decode"]["weight_bytes"] > 0 and counted["prefill"]["flops"] > 0
        assert_plain(snap.to_dict())
        json.dumps(snap.to_dict(), allow_nan=False)
    finally:
        engine.abort_request("watched")
        engine.step()


def test_async_engine_builds_snapshots_on_its_thread_only_when_asked(tiny_gemma):
    engine = tiny_gemma.engine
    calls = []
    builder = AsyncEngine(engine)
    original = builder.core.loop.snapshots
    builder.core.loop.snapshots = lambda e: calls.append(1) or original(e)
    assert isinstance(builder, SnapshotClient)

    async def run():
        builder.start()
        try:
            queue: asyncio.Queue = asyncio.Queue()
            await builder.add_request("r", list(range(5, 15)), SamplingParams(max_tokens=4), queue)
            while not (await queue.get()).finished:
                pass
            assert calls == []  # steps ran; no snapshot was built
            return await builder.snapshot()
        finally:
            builder.stop()

    snap = asyncio.run(run())
    assert isinstance(snap, EngineSnapshot) and calls == [1]
    assert snap.counters.generation_tokens >= 4 and snap.requests == []


# ---- KV tiers ---------------------------------------------------------------------------------
TIER_BYTES = 4 << 20


@pytest.fixture
def tiered_gemma(gemma_folder, tmp_path):
    llm = LLM(model=str(gemma_folder), kv_offload_memory=TIER_BYTES,
              kv_offload_dir=str(tmp_path / "tier"), kv_offload_disk=TIER_BYTES,
              **TINY)  # fmt: skip
    yield llm
    llm.shutdown()  # removes its RAM tier


def test_a_tiered_engine_s_snapshot_holds_each_tier_and_clear_empties_them(tiered_gemma):
    engine = tiered_gemma.engine
    tiered_gemma.generate([list(range(5, 45))], SamplingParams(max_tokens=2), use_tqdm=False)
    engine.connector.flush()  # the writer thread's queue: every saved block written
    snap = SnapshotBuilder()(engine)
    assert [t["name"] for t in snap.kv_tiers] == ["memory", "disk"]  # lookup order: RAM first
    saved = snap.kv_connector["blocks_saved"]
    assert saved > 0 and snap.kv_connector["saves_dropped"] == 0
    for tier in snap.kv_tiers:
        assert tier["capacity_bytes"] == TIER_BYTES and tier["write_errors"] == 0
        assert tier["stored_bytes"] == tier["bytes_written"] > 0
    assert_plain(snap.to_dict())
    # Across the core process's pipe the tiers arrive as they left (msgspec, async_core_client).
    crossed = ipc.decode_from_core(ipc.encode(ipc.CallResult(0, snap))).result
    assert _typed(crossed, EngineSnapshot).kv_tiers == snap.kv_tiers

    assert tiered_gemma.clear_kv_tiers() == 2 * saved  # each block: a file in both tiers
    after = SnapshotBuilder()(engine)
    assert [t["stored_bytes"] for t in after.kv_tiers] == [0, 0]
    assert after.kv_tiers[1]["bytes_written"] == snap.kv_tiers[1]["bytes_written"]  # cumulative
    assert tiered_gemma.clear_kv_tiers() == 0


def test_an_engine_without_tiers_refuses_to_clear_them(tiny_gemma):
    with pytest.raises(InvalidRequest, match="keeps no KV tiers: configure one with"):
        tiny_gemma.clear_kv_tiers()


def test_a_tiered_engine_served_in_process_clears_and_exports_its_tiers(tiered_gemma):
    """The whole way: route → AsyncEngine → its core loop → LLMEngine → the connector."""
    from starlette.testclient import TestClient

    from inferd.server.app import ServerSettings, create_app
    from inferd.server.dashboard.sampler import MIN_INTERVAL_S

    tiered_gemma.generate([list(range(5, 45))], SamplingParams(max_tokens=2), use_tqdm=False)
    tiered_gemma.engine.connector.flush()
    app = create_app(AsyncEngine(tiered_gemma.engine), ServerSettings(api_key="k"))
    auth = {"Authorization": "Bearer k"}
    with TestClient(app) as http:
        metrics = http.get("/metrics").text
        tiers = http.get("/dashboard/snapshot", headers=auth).json()["kv_tiers"]
        refused = http.post("/kv/clear")
        cleared = http.post("/kv/clear", headers=auth)
        time.sleep(MIN_INTERVAL_S + 0.05)  # past the sampler's cap: a fresh snapshot
        emptied = http.get("/dashboard/snapshot", headers=auth).json()["kv_tiers"]
    assert 'inferd:kv_tier_bytes_written_total{engine="0",model_name="' in metrics
    assert 'tier="disk"' in metrics and 'tier="memory"' in metrics
    assert [t["name"] for t in tiers] == ["memory", "disk"] and tiers[1]["stored_bytes"] > 0
    assert refused.status_code == 401
    assert cleared.status_code == 200 and cleared.json()["object"] == "kv.clear"
    assert cleared.json()["removed_blocks"] > 0
    assert [t["stored_bytes"] for t in emptied] == [0, 0]


class FakeCuda:
    """torch.cuda's memory figures, as the snapshot reads them."""

    def memory_allocated(self, device=None) -> int:
        return 700

    def memory_reserved(self, device=None) -> int:
        return 900

    def mem_get_info(self, device=None) -> tuple[int, int]:
        return 4000, 10_000  # free, total


def test_the_cuda_figures_come_from_the_allocator_and_the_device():
    m = memory_snapshot(torch.device("cuda", 0), 300, 200, None, cuda=FakeCuda())
    assert (m.device, m.cuda_allocated, m.cuda_reserved) == ("cuda", 700, 900)
    assert (m.cuda_device_used, m.device_total) == (6000, 10_000)
    cpu = memory_snapshot(torch.device("cpu"), 300, 200, None)
    assert cpu.cuda_allocated is None and cpu.device_total > 0 and cpu.rss > 0

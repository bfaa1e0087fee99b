"""An `EngineSnapshot` (inferd/engine_snapshot.py) of a live `EngineCore`, for the dashboard.

    builder = SnapshotBuilder()
    snapshot = builder(engine)        # on the engine's thread, between two steps

NOTE: it reads the scheduler's and the KV manager's objects as they are, so it must run where
the steps run (core_loop.py runs it for an `ipc.Call`), and only when asked: the engine does no work
for it otherwise. Its cost is a pass over the blocks in use and the cached ones, one over the
running requests and a read of /proc: well under a millisecond for the embedded model's pool;
servers cap how often they ask (inferd/server/dashboard/sampler.py). The memory figures and
their prediction: dashboard_memory.py.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import TYPE_CHECKING

from inferd.engine.core.dashboard_memory import memory_snapshot, predict_memory, weight_bytes
from inferd.engine.scheduling.kv_cache import NULL_BLOCK, BlockPool, KVCacheManager
from inferd.engine.scheduling.request import Request
from inferd.engine.scheduling.scheduler import Scheduler
from inferd.engine_snapshot import (
    BLOCK_CACHED,
    BLOCK_FREE,
    BLOCK_NULL,
    BLOCK_SHARED,
    BLOCK_USED,
    WAITING_SHOWN,
    Counters,
    EngineSettings,
    EngineSnapshot,
    KVGroupSnapshot,
    MemoryPrediction,
    MemorySnapshot,
    RequestSnapshot,
    StepKindTiming,
)
from inferd.step_timing import STEP_KINDS, STEP_PHASES, StepTiming

if TYPE_CHECKING:
    from inferd.engine.core.core import EngineCore


class SnapshotBuilder:
    """Snapshots of one engine; keeps what changes rarely (the memory prediction, computed at the
    first snapshot, and the count of weight bytes, which never change after load)."""

    def __init__(self) -> None:
        self._prediction: MemoryPrediction | None = None
        self._predicted = False
        self._weights: int | None = None

    def __call__(self, engine: EngineCore) -> EngineSnapshot:
        now = time.monotonic()
        scheduler, setup = engine.scheduler, engine.setup
        running = _requests_of(scheduler.running)
        # A request with n > 1 may have samples running and others waiting: it counts as running.
        waiting = _requests_of([*scheduler.waiting, *scheduler.awaiting_grammar], running)
        places = _Places(scheduler)
        shown = [*running.values(), *list(waiting.values())[:WAITING_SHOWN]]
        c = scheduler.counters
        layers = [len(group) for _, group in engine.model_config.kv_groups()]
        return EngineSnapshot(
            monotonic_s=now,
            settings=EngineSettings(
                model=engine.model_info.name,
                device=str(setup.device),
                dtype=str(setup.dtype).removeprefix("torch."),
                max_model_len=engine.max_model_len,
                max_num_seqs=scheduler.max_num_seqs,
                max_num_batched_tokens=scheduler.max_num_batched_tokens,
                block_size=engine.kv.block_size,
                prefix_caching=engine.kv.enable_prefix_caching,
            ),
            kv=kv_groups(engine.kv, scheduler, layers, setup.kv_plan.block_bytes),
            requests=[request_snapshot(r, places, now) for r in shown],
            num_running=len(running),
            num_waiting=len(waiting),
            counters=Counters(
                c.prompt_tokens_computed,
                c.generation_tokens,
                c.prefix_cache_queries,
                c.prefix_cache_hits,
                c.num_preemptions,
                c.steps,
            ),
            steps=step_kinds(engine.step_timer.snapshot()),
            last_step=dict(engine.step_timer.last),
            memory=self._memory(engine, now),
            **kv_tiers(engine),
            efficiency=efficiency_view(engine),
        )

    def _memory(self, engine: EngineCore, now: float) -> MemorySnapshot:
        setup = engine.setup
        if not self._predicted:
            self._predicted = True
            self._prediction = predict_memory(engine)
        if self._weights is None and setup.runner.model is not None:  # None: asleep, level 2
            self._weights = weight_bytes(setup.runner.model)
        return memory_snapshot(setup.device, self._weights or 0, setup.kv_plan.total_bytes,
                               self._prediction)  # fmt: skip


def efficiency_view(engine: EngineCore) -> dict:
    """The snapshot's `efficiency`: the meter's counts as plain numbers (the page differences
    two snapshots for the recent MBU and MFU; inferd/step_efficiency.py)."""
    meter = getattr(engine, "efficiency", None)  # an LLMEngine whose core is remote has none
    if meter is None:
        return {}
    record = meter.snapshot()
    kinds = {kind: {name: getattr(k, name) for name in EFFICIENCY_FIELDS}
             for kind, k in record.kinds.items()}  # fmt: skip
    peaks = None if record.peaks is None else asdict(record.peaks)
    return {"kinds": kinds, "peaks": peaks, "last": record.last}


EFFICIENCY_FIELDS = ("steps", "seconds", "weight_bytes", "kv_bytes", "flops", "rated_seconds",
                     "memory_seconds", "compute_seconds")  # fmt: skip


def kv_tiers(engine: EngineCore) -> dict:
    """The snapshot's `kv_tiers` and `kv_connector`: read from the connector itself (a few
    attribute reads), not from the stats the core sends with its steps, which an idle engine
    does not refresh while its writer thread still writes or a clear empties the tiers."""
    # NOTE: an LLMEngine whose core is in another process has no connector here (llm_engine.py)
    connector = getattr(engine, "connector", None)
    if connector is None:
        return {}
    return {"kv_tiers": [asdict(tier) for tier in connector.stats()],
            "kv_connector": asdict(connector.counters)}  # fmt: skip


def _requests_of(sequences, skip: dict[str, Request] | None = None) -> dict[str, Request]:
    """The requests of `sequences` by id, each once, in order, but for those in `skip`."""
    seen: dict[str, Request] = {}
    for seq in sequences:
        rid = seq.request.request_id
        if skip is None or rid not in skip:
            seen.setdefault(rid, seq.request)
    return seen


class _Places:
    """Where each sequence is (by identity: sequences compare by value, which is costly)."""

    def __init__(self, scheduler: Scheduler):
        self.running = {id(s) for s in scheduler.running}
        self.compiling = {id(s) for s in scheduler.awaiting_grammar}

    def state(self, req: Request) -> str:
        samples = req.sequences
        if any(id(s) in self.compiling for s in samples):
            return "grammar"
        running = [s for s in samples if id(s) in self.running]
        if running:
            return "decode" if all(s.prefill_done for s in running) else "prefill"
        return "preempted" if req.metrics.num_preemptions else "queued"


def kv_groups(kv: KVCacheManager, scheduler: Scheduler, layers: list[int],
              block_bytes: list[int]) -> list[KVGroupSnapshot]:  # fmt: skip
    """Every block's state per group, and the blocks each unfinished request holds."""
    holders = [s for s in (*scheduler.running, *scheduler.waiting) if s.block_tables]
    groups = []
    for g, pool in enumerate(kv.pools):
        owners: dict[str, list[int]] = {}
        for seq in holders:
            held = [b for b in seq.block_tables[g] if b != NULL_BLOCK]
            if held:
                owners.setdefault(seq.request.request_id, []).extend(held)
        groups.append(KVGroupSnapshot(kv.windows[g], layers[g], block_bytes[g],
                                      block_states(pool, owners.values()), owners))  # fmt: skip
    return groups


def block_states(pool: BlockPool, tables) -> str:
    """One BLOCK_* character per block of `pool`: free, cached, used, shared, or null."""
    states = bytearray(BLOCK_FREE.encode() * pool.num_blocks)
    states[NULL_BLOCK] = ord(BLOCK_NULL)
    cached, used, shared = ord(BLOCK_CACHED), ord(BLOCK_USED), ord(BLOCK_SHARED)
    for block in pool.cached.values():  # every block holding a prefix-cache entry
        if pool.ref[block] == 0:
            states[block] = cached
    for table in tables:
        for block in table:
            states[block] = shared if pool.ref[block] > 1 else used
    return states.decode("ascii")


def request_snapshot(req: Request, places: _Places, now: float) -> RequestSnapshot:
    samples = req.sequences
    m = req.metrics
    furthest = max(samples, key=lambda s: s.num_computed)
    longest = max(s.num_output_tokens for s in samples)
    held = {(g, b) for s in samples for g, t in enumerate(s.block_tables) for b in t
            if b != NULL_BLOCK}  # fmt: skip
    return RequestSnapshot(
        request_id=req.request_id,
        state=places.state(req),
        prompt_tokens=len(req.prompt_token_ids),
        computed_tokens=min(furthest.num_computed, furthest.num_prompt_tokens),
        output_tokens=longest,
        max_tokens=req.max_tokens,
        num_samples=len(samples) + len(req.forks),
        cached_prompt_tokens=m.num_cached_tokens,
        preemptions=m.num_preemptions,
        blocks=len(held),
        age_s=now - m.arrival_time,
        events=[(name, round(t, 6)) for name, t in m.timeline()],
    )


def step_kinds(timing: StepTiming) -> list[StepKindTiming]:
    return [
        StepKindTiming(
            kind=kind,
            steps=timing.steps[kind].count,
            seconds=timing.steps[kind].total,
            tokens=int(timing.tokens[kind].total),
            phase_seconds={p: timing.phases[kind, p].total for p in STEP_PHASES},
        )
        for kind in STEP_KINDS
    ]

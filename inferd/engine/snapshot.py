"""An `EngineSnapshot` (inferd/engine_snapshot.py) of a live `LLMEngine`, for the dashboard.

    builder = SnapshotBuilder()
    snapshot = builder(engine)        # on the engine's thread, between two steps

NOTE: it reads the scheduler's and the KV manager's objects as they are, so it must run where
the steps run (AsyncEngine runs it as a `_Call`), and only when asked: the engine does no work
for it otherwise. Its cost is a pass over the blocks in use and the cached ones, one over the
running requests and a read of /proc: well under a millisecond for the embedded model's pool;
servers cap how often they ask (inferd/server/dashboard/sampler.py).
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from inferd.engine.kv_cache import NULL_BLOCK, BlockPool, KVCacheManager
from inferd.engine.request import Request
from inferd.engine.scheduler import Scheduler
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
from inferd.memory.snapshot import proc_status
from inferd.step_timing import STEP_KINDS, STEP_PHASES, StepTiming

if TYPE_CHECKING:
    from inferd.engine.engine import LLMEngine

log = logging.getLogger(__name__)

_WEIGHTS_EVERY_S = 5.0  # the weights change once at most (the bf16 copy): recount now and then


class SnapshotBuilder:
    """Snapshots of one engine; keeps what changes rarely (the memory prediction, computed at the
    first snapshot, and the count of weight bytes)."""

    def __init__(self) -> None:
        self._prediction: MemoryPrediction | None = None
        self._predicted = False
        self._weights = 0
        self._weights_at = -_WEIGHTS_EVERY_S

    def __call__(self, engine: LLMEngine) -> EngineSnapshot:
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
        )

    def _memory(self, engine: LLMEngine, now: float) -> MemorySnapshot:
        setup = engine.setup
        if not self._predicted:
            self._predicted = True
            self._prediction = predict_memory(engine)
        if now - self._weights_at >= _WEIGHTS_EVERY_S:
            self._weights, self._weights_at = _weight_bytes(setup.runner.model), now
        return memory_snapshot(setup.device, self._weights, setup.kv_plan.total_bytes,
                               self._prediction)  # fmt: skip


def memory_snapshot(device, weights: int, kv_pool: int, predicted: MemoryPrediction | None,
                    cuda=None) -> MemorySnapshot:  # fmt: skip
    """What the process holds now. `device`: a torch.device; `cuda`: where CUDA figures come
    from (torch.cuda unless a test hands in a fake: memory_allocated, memory_reserved and
    mem_get_info, each of a device)."""
    status = proc_status()
    # NOTE: not glibc's heap figures (memory/snapshot.py heap_stats): mallinfo2 walks every
    # arena, tens of milliseconds with a model loaded, which a step must not wait for.
    memory = MemorySnapshot(
        device=device.type,
        weights=weights,
        kv_pool=kv_pool,
        rss=status.get("VmRSS"),
        rss_anon=status.get("RssAnon"),
        rss_peak=status.get("VmHWM"),
        device_total=_ram() if device.type == "cpu" else None,
        predicted=predicted,
    )
    if device.type == "cuda":
        if cuda is None:
            import torch

            cuda = torch.cuda
        free, total = cuda.mem_get_info(device)
        memory.cuda_allocated = cuda.memory_allocated(device)
        memory.cuda_reserved = cuda.memory_reserved(device)
        memory.cuda_device_used, memory.device_total = total - free, total
    return memory


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


def _weight_bytes(model) -> int:
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def _ram() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return None


_DENSE = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}


def predict_memory(engine: LLMEngine) -> MemoryPrediction | None:
    """What `inferd memory` predicts for this engine's model, mode, step budget and context;
    None where its estimate does not cover the settings (it logs why)."""
    from inferd.memory.estimate import estimate_memory
    from inferd.memory.weights import checkpoint_weights

    config, setup = engine.config, engine.setup
    checkpoint = setup.checkpoint
    dtype, block_kernels = _DENSE.get(str(setup.dtype), "auto"), False
    if config.quantization == "gguf":  # blocks without the default mode's bf16 copy
        log.info("no memory prediction for the dashboard: the estimate does not model "
                 "--quantization gguf")  # fmt: skip
        return None
    if config.quantization in ("int8", "int4", "fp8"):
        dtype = config.quantization
    elif config.dtype == "auto" and config.quantization is None:
        dtype = "auto"
        if setup.device.type == "cpu" and checkpoint.format == "gguf":
            from inferd.cpu_kernels import kernels_available

            block_kernels = kernels_available()
    try:
        est = estimate_memory(
            engine.model_config,
            dtype=dtype,
            kv_cache_dtype=_DENSE.get(str(engine.runner.kv_caches[0][0].dtype), "auto"),
            max_model_len=engine.max_model_len,
            concurrency=setup.max_num_seqs,
            max_num_batched_tokens=setup.max_num_batched_tokens,
            tensor_parallel_size=config.tensor_parallel_size,
            device=setup.device.type,
            checkpoint=checkpoint_weights(checkpoint),
            block_kernels=block_kernels,
        )
    except ValueError as e:
        log.info("no memory prediction for the dashboard: %s", e)
        return None
    per_device, plan = est.per_device, est.weight_plan
    copy = plan.copy if plan is not None else 0
    return MemoryPrediction(
        weights=per_device.weights - copy,
        weights_copy=copy,
        kv_pool=setup.kv_plan.total_bytes,
        activations=per_device.activations.peak_bytes,
        overhead=per_device.overhead.bytes,
    )

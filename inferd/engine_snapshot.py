"""The engine's state at one moment, as plain data: what the dashboard draws.

    EngineSnapshot
      settings   the limits the engine runs under (pool, budget, context)
      kv         per KV group: every block's state, which request holds which block
      requests   running and waiting requests, with their timeline stamps
      counters   cumulative tokens, prefix-cache lookups and hits, preemptions, steps
      steps      cumulative time per step phase, per kind of step (clients difference two
                 snapshots for the recent mix), and the last step's phases
      memory     what the process holds now, next to `inferd memory`'s prediction
      kv_tiers   per KV tier (RAM, disk) what it did since start; kv_connector: the blocks
                 that left the pool for the tiers or came back (both empty without tiers)
      efficiency bytes read and FLOPs per kind of step, against the machine's peaks (MBU, MFU)

Built on the engine's thread, between steps, only when someone asks
(inferd/engine/core/dashboard_view.py); a server reaches it through `SnapshotClient` in
inferd/engine_client.py. Only ints, floats, strings, lists and dicts of them (and these
dataclasses), so it crosses a process boundary or becomes JSON unchanged (`to_dict`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# One character per block of a KV group, at the block's index (block 0 is the null block).
BLOCK_NULL = "-"  # the null block: padding for table entries, never handed out
BLOCK_FREE = "."  # free, holding nothing reusable
BLOCK_CACHED = "c"  # free, but its tokens stay findable for prefix reuse until evicted (LRU)
BLOCK_USED = "u"  # held by one sequence
BLOCK_SHARED = "s"  # held by several sequences (a shared prefix, or n > 1 samples)


@dataclass
class EngineSettings:
    model: str
    device: str  # "cpu", "cuda:0"
    dtype: str  # the compute dtype, e.g. "bfloat16"
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int  # tokens per KV block
    prefix_caching: bool


@dataclass
class KVGroupSnapshot:
    """One KV group: the layers that share an attention window, and their block pool."""

    window: int | None  # sliding-window tokens; None: full attention
    num_layers: int
    block_bytes: int  # one block of this group, all its layers, keys and values
    blocks: str  # one BLOCK_* character per block, index = block id
    # request id → the block ids its sequences hold in this group (null entries left out)
    owners: dict[str, list[int]] = field(default_factory=dict)

    def count(self, state: str) -> int:
        return self.blocks.count(state)


@dataclass
class RequestSnapshot:
    request_id: str
    # queued (never scheduled), prefill, decode, preempted (waiting to recompute),
    # grammar (its structured-output grammar is still compiling)
    state: str
    prompt_tokens: int
    computed_tokens: int  # of the furthest sample: prompt tokens computed, during a prefill
    output_tokens: int  # of the longest sample
    max_tokens: int
    num_samples: int
    cached_prompt_tokens: int  # served from the prefix cache when first scheduled
    preemptions: int
    blocks: int  # distinct KV blocks held, all groups
    age_s: float  # seconds since it arrived
    # (event, seconds since arrival): arrived, queued, scheduled, first_token, preempted...,
    # as RequestMetrics.timeline() (inferd/outputs.py) records them
    events: list[tuple[str, float]] = field(default_factory=list)


@dataclass
class Counters:
    """Cumulative since the engine started (EngineStats' counters)."""

    prompt_tokens: int
    generation_tokens: int
    prefix_cache_queries: int  # prompt tokens looked up
    prefix_cache_hits: int  # of which found
    preemptions: int
    steps: int


@dataclass
class StepKindTiming:
    """Cumulative over the steps of one kind (decode or prefill, inferd/step_timing.py)."""

    kind: str
    steps: int
    seconds: float
    tokens: int
    phase_seconds: dict[str, float]  # schedule, prepare, forward, sample, output


@dataclass
class MemoryPrediction:
    """`inferd memory`'s estimate for this engine's settings (inferd/memory/estimate.py)."""

    weights: int  # as held after load
    kv_pool: int  # the pool the engine planned (equal to the allocation)
    activations: int  # worst step: the full token budget at the full context
    overhead: int  # runtime: Python, torch, the CUDA context

    @property
    def total(self) -> int:
        return self.weights + self.kv_pool + self.activations + self.overhead


@dataclass
class MemorySnapshot:
    device: str  # "cpu" or "cuda"
    weights: int  # parameters and buffers the model holds
    kv_pool: int  # the KV cache tensors the runner allocated
    rss: int | None = None  # the resident set of the process (Linux)
    rss_anon: int | None = None  # of which anonymous memory: tensors, heap (not file pages)
    rss_peak: int | None = None
    cuda_allocated: int | None = None
    cuda_reserved: int | None = None
    cuda_device_used: int | None = None  # the whole device: context and other processes too
    device_total: int | None = None  # RAM (CPU) or the GPU's memory
    predicted: MemoryPrediction | None = None  # None when the estimate does not cover it


@dataclass
class EngineSnapshot:
    monotonic_s: float  # the engine's time.monotonic() when taken: difference two for rates
    settings: EngineSettings
    kv: list[KVGroupSnapshot]
    requests: list[RequestSnapshot]  # running first, then waiting (at most WAITING_SHOWN)
    num_running: int
    num_waiting: int
    counters: Counters
    steps: list[StepKindTiming]
    last_step: dict[str, float]  # the last step's seconds per phase, and "step"
    memory: MemorySnapshot
    # Per tier, in lookup order (RAM first): TierStats' fields (inferd/kv_tier_stats.py) as a
    # dict: the snapshot stays plain data of the bottom row.
    kv_tiers: list[dict[str, str | int | float]] = field(default_factory=list)
    # The connector's counts: blocks_saved, saves_dropped, blocks_loaded, lookups_late.
    kv_connector: dict[str, int] = field(default_factory=dict)
    # The steps against the machine's limits (inferd/step_efficiency.py) as plain numbers:
    # "kinds" → per kind cumulative steps, seconds, weight_bytes, kv_bytes, flops,
    # rated_seconds, memory_seconds, compute_seconds; "peaks" (None: not measured); "last".
    efficiency: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


WAITING_SHOWN = 64  # a long queue is summarised by num_waiting beyond these

"""The boundary between the HTTP server and the engine: what a server may ask of an engine.

    server routes ──EngineClient──▶ AsyncEngine (inferd/engine/frontend/async_engine.py) ──▶
    LLMEngine

The server imports this module, the shared value types (`SamplingParams`, `RequestOutput`) and
the typed errors (`inferd/errors.py`), never the engine itself: anything that implements
`EngineClient` can be served, and a test can serve a fake. See docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from inferd.engine_snapshot import EngineSnapshot
from inferd.kv_tier_stats import TierStats
from inferd.outputs import RequestOutput
from inferd.pooling_params import PoolerConfig, PoolingParams
from inferd.sampling_params import SamplingParams
from inferd.step_efficiency import StepEfficiency
from inferd.step_timing import StepTiming

# A prompt as the engine takes it: text, token ids, or {"prompt": text or None,
# "prompt_token_ids": ids} when the caller tokenized it already; a dict may add "cache_salt"
# (a non-empty string mixed into the prefix-cache hashes, vLLM's field).
PromptInput = str | list[int] | dict[str, Any]


@dataclass(frozen=True)
class ModelInfo:
    """What a client may know about the served model; built once, when the engine starts."""

    name: str  # URL- and shell-friendly: 'Gemma 3 270m' → 'gemma-3-270m'
    display_name: str  # as the checkpoint names itself
    max_model_len: int  # longest prompt + output, in tokens
    vocab_size: int
    # Changes when the weights' identity, precision or inferd's version do (OpenAI's
    # system_fingerprint: the same request may be answered differently).
    fingerprint: str
    # How the model's embeddings are made (/v1/embeddings); None: the engine computes none.
    pooling: PoolerConfig | None = None


@dataclass
class EngineStats:
    """A snapshot for metrics and logs; the counters are cumulative since start."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float  # fraction of KV blocks in use (most-used group)
    num_preemptions: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    prompt_tokens: int  # prompt tokens computed (cache hits excluded, recompute included)
    generation_tokens: int
    steps: int
    # Where the steps' time went (inferd/step_timing.py); None from engines that do not time.
    step_timing: StepTiming | None = None
    # Speculative decoding, vLLM's spec_decode_* counters (inferd/spec_decode/metrics.py); all
    # zero without it. Per position j: verifications whose draft j was accepted.
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_accepted_tokens_per_pos: tuple[int, ...] = ()
    # LoRA: the adapters in slots now, and per adapter name the requests that ran under it.
    lora_resident: tuple[str, ...] = ()
    lora_requests: dict[str, int] = field(default_factory=dict)
    # KV tiers (engine/kv_tiers/): per tier what it did, and the connector's block counts.
    kv_tiers: tuple[TierStats, ...] = ()
    kv_blocks_saved: int = 0
    kv_blocks_loaded: int = 0
    kv_saves_dropped: int = 0
    kv_lookups_late: int = 0
    sleep_level: int = 0  # 0 awake, else the level of POST /sleep (engine/core/sleep_mode.py)
    # NOTE: fields are added last: tests and callers build EngineStats positionally.
    num_queue_timeouts: int = 0  # requests ended unscheduled past max_queue_time
    # Disaggregated serving (engine/disaggregation/): the engine's role ("prefill", "decode";
    # "" when it does both), the requests whose KV it handed on (prefill) or received
    # (decode), the bytes that moved through the transfer tier (written by a prefill engine,
    # read by a decode engine), the seconds spent moving them (a prefill engine's flush, a
    # decode engine's reads), and the handed-on blocks a decode engine recomputed (late or lost).
    engine_role: str = ""
    kv_transfers: int = 0
    kv_transfer_bytes: int = 0
    kv_transfer_seconds: float = 0.0
    kv_transfer_blocks_recomputed: int = 0
    # Bytes read, FLOPs, MBU and MFU of the steps (inferd/step_efficiency.py); None from
    # engines that do not count them.
    step_efficiency: StepEfficiency | None = None


class TokenizerLike(Protocol):
    """The tokenizer operations the server uses (inferd.tokenizer.Tokenizer has them)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str | None]: ...

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """The rendered conversation; raises ValueError when it cannot be rendered (no
        template, or the template refuses the messages)."""
        ...

    def chat_prompt(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        *,
        split_special_tokens: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> tuple[str, list[int]]:
        """(prompt text, token ids) of the conversation, special-token strings in user text
        kept as text unless `split_special_tokens` is False (inferd.tokenizer.Tokenizer's
        contract); ValueError when it cannot be rendered."""
        ...


@runtime_checkable
class EngineClient(Protocol):
    """An engine as an asyncio server sees it. Methods are called on the event loop."""

    @property
    def model_info(self) -> ModelInfo: ...

    @property
    def tokenizer(self) -> TokenizerLike: ...

    def start(self) -> None:
        """Start serving (inside the running event loop)."""

    def stop(self, timeout: float = 30.0) -> None:
        """Stop serving; requests still in flight are failed."""

    async def add_request(
        self,
        request_id: str,
        prompt: PromptInput,
        params: SamplingParams | PoolingParams,
        outputs: asyncio.Queue,
        arrival_time: float | None = None,
    ) -> None:
        """Generate for one prompt (SamplingParams), or embed it (PoolingParams: its one output
        is an `EmbeddingRequestOutput`). Returns once the request is queued; from then on its
        outputs (`RequestOutput`s after each step with news, holding only the news when
        `params.output_kind` is DELTA, else cumulative; the last with `finished`) arrive in
        `outputs`, or an exception that ends the stream (`RequestFailed`, `EngineDeadError`). Raises
        `InvalidRequest`, `Overloaded` or `EngineDeadError` with nothing queued. Several requests
        may share one `outputs` queue."""

    def abort(self, request_id: str) -> None:
        """Stop a request and free what it holds; its queue gets no more outputs."""

    def health(self) -> str | None:
        """None when healthy, else why not (the engine died, or makes no progress)."""

    def stats(self) -> EngineStats:
        """The latest snapshot of the engine's gauges and counters."""

    def observe_outputs(self, callback: Callable[[RequestOutput], None]) -> None:
        """Call `callback` on the event loop for every output of every request, in order,
        including those nobody reads any more (for metrics)."""


# ---- profiling (optional: a server offers /start_profile only when its client has it) -------
@dataclass(frozen=True)
class TraceFiles:
    """What a stopped trace wrote (inferd/profiling/trace.py)."""

    trace: str  # Chrome trace format JSON (Perfetto, chrome://tracing)
    ops_table: str  # the profiler's table of the top ops, as text
    steps: int  # engine steps the trace holds
    table: str  # the table itself


class ProfilerStateError(RuntimeError):
    """A trace was started while one runs, or stopped while none does."""


@runtime_checkable
class ProfilingClient(Protocol):
    """An engine client that can trace its engine (AsyncEngine can)."""

    async def start_profile(self, directory: str) -> None:
        """Start a torch.profiler trace of the engine's steps, written to `directory` when it
        stops. Raises ProfilerStateError when one runs already, ValueError when the directory
        cannot be written."""

    async def stop_profile(self) -> TraceFiles:
        """Stop the trace and write its files; ProfilerStateError when none runs."""


# ---- the dashboard (optional: a server offers /dashboard's data only when its client has it) --
@runtime_checkable
class SnapshotClient(Protocol):
    """An engine client that can describe its engine's state (AsyncEngine, AsyncCoreClient)."""

    async def snapshot(self) -> EngineSnapshot:
        """The engine's state now (inferd/engine_snapshot.py), built between two steps; the
        engine does no work for it unless asked. Raises EngineDeadError when the engine died."""


# ---- KV tiers (optional: a server answers POST /kv/clear with 501 when its client lacks it) ---
@runtime_checkable
class KVTierClient(Protocol):
    """An engine client that can empty its engine's KV tiers (AsyncEngine, AsyncCoreClient)."""

    async def clear_kv_tiers(self) -> int:
        """Delete every block of the KV tiers of every replica; returns how many blocks went.
        Raises InvalidRequest when the engine keeps no tiers (nothing to clear is the caller's
        mistake, not a success), NotImplementedError when this kind of deployment cannot reach
        every replica's tiers, EngineDeadError when the engine died."""


# ---- sleep (optional: a server answers /sleep, /wake_up, /is_sleeping with 501 without it) ----
@runtime_checkable
class SleepClient(Protocol):
    """An engine client whose engines can free their memory while idle and take it back
    (AsyncEngine, AsyncCoreClient): engine/core/sleep_mode.py."""

    wake_on_request: bool  # a request that arrives while asleep wakes the engine (else 503)

    async def sleep(self, level: int) -> dict[str, Any]:
        """Every replica frees its KV pool (level 2: its weights too): `{"level", "freed_bytes",
        "rss_before", "rss_after"}`, summed over the replicas. Raises RequestsRunning (nothing
        changes) while requests run, InvalidRequest for a bad level or where sleep cannot
        work, NotImplementedError where this kind of deployment cannot reach every replica,
        EngineDeadError when the engine died."""

    async def wake_up(self) -> dict[str, Any]:
        """Every replica takes its memory back: `{"level" (the one it slept at; 0: it was
        awake), "seconds", "rss_after"}`."""

    def is_sleeping(self) -> bool: ...


def notify_observers(observers: list[Callable[[RequestOutput], None]], out: RequestOutput) -> None:
    """Hand `out` to every `observe_outputs` callback; one that raises is logged and skipped,
    since metrics and the dashboard must never break the delivery of outputs."""
    for observe in observers:
        try:
            observe(out)
        except Exception:  # noqa: BLE001 - see the docstring
            logging.getLogger(__name__).exception("output observer failed")

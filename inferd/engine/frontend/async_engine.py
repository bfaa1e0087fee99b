"""The engine as an asyncio server sees it (`inferd.engine_client.EngineClient`) when it runs in
this process (`LLM`, `inferd serve --no-engine-core-process`, tests with a fake engine; by default
`inferd serve` runs the core in its own process): the server's client of async_core_client.py, with
one core, a `CoreThread` (core_thread.py) whose loop steps an `LLMEngine`.

    HTTP handler ──add/abort──▶ CoreThread: CoreLoop.run (core_loop.py), engine.step()
    HTTP handler ◀── per-request asyncio.Queue ◀── ipc.Outputs (call_soon_threadsafe)

The event loop never waits on a step; the engine tokenizes and detokenizes on the loop's thread.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inferd.engine.frontend.async_core_client import AsyncCoreClient, CoreReplica
from inferd.engine.kv_tiers.open_tiers import wants_tiers
from inferd.engine.transport import ipc
from inferd.engine.transport.core_thread import CoreThread
from inferd.engine_client import EngineStats, PromptInput
from inferd.errors import EngineDeadError
from inferd.outputs import RequestOutput
from inferd.pooling_params import PoolingParams
from inferd.sampling_params import SamplingParams

if TYPE_CHECKING:
    from inferd.engine.frontend.llm_engine import LLMEngine


@dataclass
class PromptRequest:  # an in-process Add's request: the engine tokenizes it on the loop thread
    request_id: str
    prompt: PromptInput
    params: SamplingParams | PoolingParams
    arrival_time: float


class _ServedEngine:
    """An `LLMEngine` (or a fake with its methods) as `CoreLoop` drives a core."""

    def __init__(self, engine):
        self.engine = engine

    def __getattr__(self, name: str) -> Any:  # scheduler, setup, stats, ... (snapshots too)
        return getattr(self.engine, name)

    def add_request(self, r: PromptRequest) -> None:
        self.engine.add_request(r.request_id, r.prompt, r.params, r.arrival_time, stream=True)

    def compile_grammar(self, params):
        compile_grammar = getattr(self.engine, "compile_grammar", None)
        if compile_grammar is None or not isinstance(params, SamplingParams):
            return None  # a fake engine, or an embedding request: no grammar
        return compile_grammar(params)

    def step(self) -> list[RequestOutput]:
        outputs = self.engine.step()
        for out in outputs:
            # NOTE: an engine may keep mutating a request's metrics object (LLMEngine's output
            # processor hands out snapshots already; a fake may not); consumers on the event
            # loop get a snapshot that matches this output.
            if out.metrics is not None:
                out.metrics = copy.copy(out.metrics)
        return outputs


class _Processed:
    """The engine built the outputs on its loop's thread: nothing is left for the event loop."""

    @staticmethod
    def process(outputs: list[RequestOutput], now: float) -> tuple[list[RequestOutput], list]:
        return outputs, []

    @staticmethod
    def forget(request_id: str) -> None:
        pass


class AsyncEngine(AsyncCoreClient):
    """Implements `EngineClient` around a synchronous engine (an `LLMEngine`, or anything with
    its request and step methods): async_core_client.py's front end, with one core in a thread."""

    outputs = _Processed()
    replica_stats = None  # one engine: the server's metrics read stats()
    # NOTE: served in-process, a dead engine leaves the server up (/health: 503) and its exit
    # status alone (commands/serve.py looks for these two).
    on_dead = property(lambda self: None, lambda self, callback: None)
    dead_reason = None

    def __init__(
        self,
        engine: LLMEngine,
        stall_timeout: float = 60.0,  # health(): seconds without a step while busy, at least
    ):
        self.engine, self.stall_timeout = engine, stall_timeout
        self.core = CoreThread(_ServedEngine(engine), stall_timeout)
        self._model_info, self._tokenizer = engine.model_info, engine.tokenizer
        bound = self.core.loop.stall.bound()
        self._track([CoreReplica(self.core, stats=engine.stats(), stall_bound=bound)])

    def start(self) -> None:
        super().start()
        self.core.start()

    def stats(self) -> EngineStats:
        return self.replicas[0].stats

    def _keeps_kv_tiers(self) -> bool:
        config = getattr(self.engine, "config", None)  # a fake engine may have none: no tiers
        return config is not None and wants_tiers(config)

    def stall_bound(self) -> float:
        """Seconds without a completed step, while busy, after which the engine is stalled."""
        return self.replicas[0].stall_bound

    def _name(self, index: int) -> str:
        return "the engine"

    def _admit(self, request_id: str, prompt: PromptInput, params: SamplingParams | PoolingParams,
               arrival_time: float | None) -> tuple[CoreReplica, Callable[[], None]]:  # fmt: skip
        replica = self.replicas[0]
        if replica.dead is not None:
            raise EngineDeadError(replica.dead)
        arrival = arrival_time if arrival_time is not None else time.monotonic()
        add = ipc.Add(PromptRequest(request_id, prompt, params, arrival))
        return replica, lambda: self.core.send(add)

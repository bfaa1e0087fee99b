"""The engine as an asyncio server sees it (`inferd.engine_client.EngineClient`) when it runs in
this process (`LLM`, `inferd serve --no-engine-core-process`, tests with a fake engine; by default
`inferd serve` runs the core in its own process: core_client.py): the asyncio adapter over a
`CoreThread` (core_thread.py) whose loop steps an `LLMEngine`.

    HTTP handler ──add/abort──▶ CoreThread: CoreLoop.run (core_loop.py), engine.step()
    HTTP handler ◀── per-request asyncio.Queue ◀── ipc.Outputs (call_soon_threadsafe)

The event loop never waits on a step. An add returns once the engine took it, so a bad request
is still a 400 before any streaming starts; how many may queue is the server's decision
(server/admission.py). The engine is stalled when its loop, busy, has sent nothing for longer
than its stall bound (progress.py).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inferd.engine import ipc
from inferd.engine.core_thread import CoreThread
from inferd.engine_client import (
    EngineStats,
    ModelInfo,
    PromptInput,
    TokenizerLike,
    TraceFiles,
    notify_observers,
)
from inferd.engine_snapshot import EngineSnapshot
from inferd.errors import EngineDeadError, InvalidRequest, RequestFailed
from inferd.outputs import RequestOutput
from inferd.pooling_params import PoolingParams
from inferd.sampling_params import SamplingParams

if TYPE_CHECKING:
    from inferd.engine.engine import LLMEngine


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


class AsyncEngine:
    """Implements `EngineClient` around a synchronous engine (an `LLMEngine`, or anything with
    its request and step methods)."""

    def __init__(
        self,
        engine: LLMEngine,
        stall_timeout: float = 60.0,  # health(): seconds without a step while busy, at least
    ):
        self.engine = engine
        self.stall_timeout = stall_timeout
        self.core = CoreThread(_ServedEngine(engine), stall_timeout)
        self._stall_bound = self.core.loop.stall.bound()
        self._stats = engine.stats()  # the latest the loop sent
        self._observers: list[Callable[[RequestOutput], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queues: dict[str, asyncio.Queue] = {}  # request id → its consumer's queue
        self._adds: dict[str, asyncio.Future] = {}  # adds not yet answered
        self._calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self._active: set[str] = set()  # added and not finished: the engine is busy
        self._heard_at = time.monotonic()  # last message, or work arriving
        self._dead_reason: str | None = None

    # ---- what the server may ask (event loop) ------------------------------------------------
    @property
    def model_info(self) -> ModelInfo:
        return self.engine.model_info

    @property
    def tokenizer(self) -> TokenizerLike:
        return self.engine.tokenizer

    def stats(self) -> EngineStats:
        return self._stats

    def observe_outputs(self, callback: Callable[[RequestOutput], None]) -> None:
        self._observers.append(callback)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.core.read_on(self._loop, self._on_message)
        self.core.start()

    def stop(self, timeout: float = 30.0) -> None:
        self.core.stop(timeout)

    def health(self) -> str | None:
        """None when healthy, else why not: the loop died or no step finished for too long."""
        if self._dead_reason is not None:
            return self._dead_reason
        if not self.core.alive:
            return "the engine loop is not running"
        idle_for = time.monotonic() - self._heard_at
        bound = self._stall_bound
        if self._active and idle_for > bound:
            return (f"the engine made no progress for {idle_for:.0f} s with requests pending "
                    f"(a step may take up to {bound:.0f} s here)")  # fmt: skip
        return None

    def stall_bound(self) -> float:
        """Seconds without a completed step, while busy, after which the engine is stalled."""
        return self._stall_bound

    # ---- requests (event loop) ---------------------------------------------------------------
    async def add_request(
        self,
        request_id: str,
        prompt: PromptInput,
        params: SamplingParams | PoolingParams,
        outputs: asyncio.Queue,
        arrival_time: float | None = None,
    ) -> None:
        """Queue a request; its outputs (or an exception) go to `outputs`. Raises InvalidRequest
        or EngineDeadError, with nothing left queued (the server's admission decides about
        overload before this: inferd/server/admission.py)."""
        self._check_running()
        if request_id in self._active:
            raise InvalidRequest(None, f"request_id {request_id!r} is already in use")
        self._adds[request_id] = future = self._loop.create_future()
        self._queues[request_id] = outputs
        if not self._active:
            self._heard_at = time.monotonic()  # a stall is measured from when work arrives
        self._active.add(request_id)
        arrival = arrival_time if arrival_time is not None else time.monotonic()
        self.core.send(ipc.Add(PromptRequest(request_id, prompt, params, arrival)))
        try:
            await future
        except asyncio.CancelledError:
            self.abort(request_id)  # the add may still succeed; the abort follows it in order
            raise
        finally:
            self._adds.pop(request_id, None)

    def abort(self, request_id: str) -> None:
        """Stop a request (no-op when it already finished); its queue gets no more outputs."""
        self._queues.pop(request_id, None)
        if self._dead_reason is None:
            self.core.send(ipc.Abort([request_id]))

    # ---- profiling (ProfilingClient) and the dashboard (SnapshotClient): between steps -------
    async def start_profile(self, directory: str) -> None:
        await self._call("start_profile", directory)

    async def stop_profile(self) -> TraceFiles:
        return await self._call("stop_profile")

    async def snapshot(self) -> EngineSnapshot:
        return await self._call("snapshot")

    async def _call(self, method: str, *args: Any) -> Any:
        self._check_running()
        call_id = next(self._call_ids)
        self._calls[call_id] = future = self._loop.create_future()
        self.core.send(ipc.Call(call_id, method, list(args)))
        try:
            return await future
        finally:
            self._calls.pop(call_id, None)

    def _check_running(self) -> None:
        if self._dead_reason is not None or self._loop is None:
            raise EngineDeadError(self._dead_reason or "the engine loop is not running")

    # ---- the loop's messages (event loop) ----------------------------------------------------
    def _on_message(self, message) -> None:
        if message is None:
            return self._ended(self.core.ended or "the engine loop stopped")
        self._heard_at = time.monotonic()
        if isinstance(message, ipc.CallResult):
            m = message
            return _settle(self._calls.get(m.call_id), m.result, m.error_type, None, m.message)
        self._stall_bound = message.stall_bound or self._stall_bound
        if message.stats is not None:
            self._stats = message.stats
        for ack in message.acks:
            if ack.error_type is not None:  # refused: nothing of it runs
                self._queues.pop(ack.request_id, None)
                self._active.discard(ack.request_id)
            _settle(self._adds.get(ack.request_id), None, ack.error_type, ack.param, ack.message)
        for out in message.outputs:
            notify_observers(self._observers, out)
            queue = self._queues.get(out.request_id)
            if queue is not None:
                queue.put_nowait(out)
            if out.finished:
                self._queues.pop(out.request_id, None)
                self._active.discard(out.request_id)
        for failure in message.failed:
            self._active.discard(failure.request_id)
            queue = self._queues.pop(failure.request_id, None)
            if queue is not None:
                queue.put_nowait(RequestFailed(failure.message))

    def _ended(self, reason: str) -> None:
        self._dead_reason = reason
        for future in [*self._adds.values(), *self._calls.values()]:
            if not future.done():
                future.set_exception(EngineDeadError(reason))
        for queue in self._queues.values():
            queue.put_nowait(EngineDeadError(reason))
        self._queues.clear()
        self._active.clear()


def _settle(future: asyncio.Future | None, result: Any, error_type: str | None,
            param: str | None, message: str) -> None:  # fmt: skip
    if future is None or future.done():
        return
    if error_type is None:
        future.set_result(result)
    else:
        future.set_exception(ipc.rebuild_error(error_type, param, message))

"""The engine as an asyncio server sees it (`inferd.engine_client.EngineClient`): one thread owns
the `LLMEngine`, the asyncio event loop owns the clients.

    HTTP handler ──add/abort──▶ command queue ──▶ loop thread: apply commands, engine.step()
    HTTP handler ◀── per-request asyncio.Queue ◀── call_soon_threadsafe(deliver, outputs)

The engine is not thread-safe, so only the loop thread touches it; the event loop never waits
on a step. Commands are applied between steps, so an abort takes effect (and frees its KV
blocks) before the next step. With no work the thread blocks on the command queue instead of
spinning. Requests are validated by the engine itself in `add_request`: the caller awaits the
verdict, so a bad request is still answered with a 400 before any streaming starts. How many
requests may queue is the server's decision, taken on the event loop (server/admission.py).

Health is judged by progress: the engine is stalled when no step has completed for longer than
a bound while work is pending (progress.py). This is the in-process client (`LLM`, `inferd serve
--no-engine-core-process`, tests with a fake engine); `inferd serve` runs the engine core in its
own process by default (core_client.py).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inferd.engine.progress import StallBound
from inferd.engine.snapshot import SnapshotBuilder
from inferd.engine_client import (
    EngineStats,
    ModelInfo,
    PromptInput,
    TokenizerLike,
    TraceFiles,
    notify_observers,
)
from inferd.engine_snapshot import EngineSnapshot
from inferd.errors import EngineDeadError, RequestFailed
from inferd.memory_trim import malloc_trim
from inferd.outputs import RequestOutput
from inferd.pooling_params import PoolingParams
from inferd.sampling_params import SamplingParams

if TYPE_CHECKING:
    from inferd.engine.engine import LLMEngine

log = logging.getLogger(__name__)

# When steps schedule nothing although requests exist (nothing fits yet), the thread waits
# this long for a command before trying again, rather than spinning on the GIL.
_STUCK_WAIT_S = 0.005


@dataclass
class _Add:
    request_id: str
    prompt: PromptInput
    params: SamplingParams
    arrival_time: float
    future: asyncio.Future


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Call:
    """Run `function(engine)` on the loop thread, between steps; its result settles `future`."""

    function: Callable[[Any], Any]
    future: asyncio.Future


_STOP = object()


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
        setup = getattr(engine, "setup", None)
        # The most tokens one step can hold (a fake engine has no setup: learned from steps).
        self._stall = StallBound(stall_timeout, getattr(setup, "max_num_batched_tokens", 0) or 0)
        self._trim = malloc_trim()
        self._worked_since_trim = False
        self._observers: list[Callable[[RequestOutput], None]] = []
        self._stats = engine.stats()  # latest snapshot, replaced (never mutated) by the thread
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Event-loop side: request id → its consumer's queue; adds not yet answered.
        self._queues: dict[str, asyncio.Queue] = {}
        self._pending_adds: set[asyncio.Future] = set()
        # Loop-thread side (read elsewhere only as whole values).
        self._active: set[str] = set()
        self._busy = False
        self._progress_at = time.monotonic()
        self._dead_reason: str | None = None
        self._stopping = False
        self._snapshots = SnapshotBuilder()  # the dashboard's, built only when asked

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
        self._thread = threading.Thread(target=self._run, name="inferd-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._commands.put(_STOP)
        if self._thread is not None:
            self._thread.join(timeout)

    def health(self) -> str | None:
        """None when healthy, else why not: the loop died or no step finished for too long."""
        if self._dead_reason is not None:
            return self._dead_reason
        if self._thread is None or not self._thread.is_alive():
            return "the engine loop is not running"
        idle_for = time.monotonic() - self._progress_at
        bound = self.stall_bound()
        if self._busy and idle_for > bound:
            return (f"the engine made no progress for {idle_for:.0f} s with requests pending "
                    f"(a step may take up to {bound:.0f} s here)")  # fmt: skip
        return None

    def stall_bound(self) -> float:
        """Seconds without a completed step, while busy, after which the engine is stalled."""
        return self._stall.bound()

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
        if self._dead_reason is not None or self._loop is None:
            raise EngineDeadError(self._dead_reason or "the engine loop is not running")
        await self._grammar_compiled(params)
        future = self._loop.create_future()
        self._queues[request_id] = outputs
        self._pending_adds.add(future)
        arrival = arrival_time if arrival_time is not None else time.monotonic()
        self._commands.put(_Add(request_id, prompt, params, arrival, future))
        try:
            await future
        except asyncio.CancelledError:
            self.abort(request_id)  # the add may still succeed; the abort follows it in order
            self._queues.pop(request_id, None)
            raise
        except BaseException:
            self._queues.pop(request_id, None)
            raise
        finally:
            self._pending_adds.discard(future)

    async def _grammar_compiled(self, params: SamplingParams) -> None:
        """Structured outputs: wait (without blocking the loop thread or the event loop) until
        the request's grammar is compiled, so that a bad spec is refused by `add_request`, as an
        InvalidRequest, before anything streams."""
        if not isinstance(params, SamplingParams):  # an embedding request has no grammar
            return
        compile_grammar = getattr(self.engine, "compile_grammar", None)
        handle = compile_grammar(params) if compile_grammar is not None else None
        if handle is None or handle.done():
            return
        loop, compiled = self._loop, self._loop.create_future()

        def wake(_) -> None:  # in the compiler's thread
            try:
                loop.call_soon_threadsafe(lambda: compiled.done() or compiled.set_result(None))
            except RuntimeError:  # the event loop closed meanwhile: nobody waits any more
                pass

        handle.add_done_callback(wake)
        await compiled

    def abort(self, request_id: str) -> None:
        """Stop a request (no-op when it already finished); its queue gets no more outputs."""
        self._queues.pop(request_id, None)
        if self._dead_reason is None:
            self._commands.put(_Abort(request_id))

    # ---- profiling (inferd.engine_client.ProfilingClient) ------------------------------------
    async def start_profile(self, directory: str) -> None:
        """Trace the engine's steps from the next one on (the profiler runs on the loop
        thread, where the steps run)."""
        await self._on_loop_thread(lambda engine: engine.start_profile(directory))

    async def stop_profile(self) -> TraceFiles:
        return await self._on_loop_thread(lambda engine: engine.stop_profile())

    # ---- the dashboard (inferd.engine_client.SnapshotClient) ---------------------------------
    async def snapshot(self) -> EngineSnapshot:
        return await self._on_loop_thread(self._snapshots)

    async def _on_loop_thread(self, function: Callable[[Any], Any]) -> Any:
        if self._dead_reason is not None or self._loop is None:
            raise EngineDeadError(self._dead_reason or "the engine loop is not running")
        future = self._loop.create_future()
        self._pending_adds.add(future)  # failed with the rest if the loop dies
        try:
            self._commands.put(_Call(function, future))
            return await future
        finally:
            self._pending_adds.discard(future)

    # ---- the loop thread ---------------------------------------------------------------------
    def _run(self) -> None:
        reason = "the engine loop stopped"
        try:
            stuck = False
            while not self._stopping:
                settled = self._apply(self._take_commands(stuck))
                self._busy = bool(self._active)
                outputs: list[RequestOutput] = []
                failed: list[tuple[str, str]] = []
                if self._active or self.engine.has_unfinished_requests():
                    outputs, failed, stuck = self._step()  # it takes the new stats
                else:
                    stuck = False
                    self._stats = self.engine.stats()
                self._busy = bool(self._active)
                if settled or outputs or failed:
                    self._post(self._deliver, settled, outputs, failed)
        except BaseException as e:  # noqa: BLE001 - whatever killed the loop, say so in /health
            log.exception("the engine loop died")
            reason = f"the engine loop died: {type(e).__name__}: {e}"
        finally:
            self._dead_reason = reason
            self._post(self._fail_all, reason)

    def _take_commands(self, stuck: bool) -> list[Any]:
        busy = self._active or self.engine.has_unfinished_requests()
        commands = []
        try:
            if not busy:
                self._return_free_memory()
                commands.append(self._commands.get())  # idle: sleep until there is work
            elif stuck:
                commands.append(self._commands.get(timeout=_STUCK_WAIT_S))
        except queue.Empty:
            pass
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _return_free_memory(self) -> None:
        """On going idle after work: hand freed pages back (memory_trim.py)."""
        if self._trim is not None and self._worked_since_trim:
            self._trim(0)
            self._worked_since_trim = False

    def _apply(self, commands: list[Any]) -> list[tuple[asyncio.Future, BaseException | None]]:
        settled = []
        for cmd in commands:
            if cmd is _STOP:
                self._stopping = True
            elif isinstance(cmd, _Call):
                self._call(cmd)
            elif isinstance(cmd, _Abort):
                try:
                    self.engine.abort_request(cmd.request_id)
                except Exception:  # noqa: BLE001 - one bad abort must not end the loop
                    log.exception("abort of %s failed", cmd.request_id)
            else:
                settled.append((cmd.future, self._add(cmd)))
        return settled

    def _call(self, cmd: _Call) -> None:
        try:
            result, error = cmd.function(self.engine), None
        except Exception as e:  # noqa: BLE001 - reported to the caller
            result, error = None, e
        self._post(_settle, cmd.future, result, error)

    def _add(self, cmd: _Add) -> BaseException | None:
        try:
            self.engine.add_request(
                cmd.request_id, cmd.prompt, cmd.params, cmd.arrival_time, stream=True
            )
        except Exception as e:  # noqa: BLE001 - reported to the client that sent it
            return e
        if not self._active:
            self._progress_at = time.monotonic()  # a stall is measured from when work arrives
        self._active.add(cmd.request_id)
        return None

    def _step(self) -> tuple[list[RequestOutput], list[tuple[str, str]], bool]:
        steps_before = self._stats.steps
        started = time.monotonic()
        try:
            outputs = self.engine.step()
        except EngineDeadError:
            raise  # fatal (e.g. a tensor-parallel worker died): the loop ends, /health says why
        except Exception as e:  # noqa: BLE001 - the engine guards its steps; this is a backstop
            log.exception("engine step raised; failing the requests in flight")
            message = f"the engine failed: {type(e).__name__}: {e}"
            failed = [(rid, message) for rid in self._active]
            for rid in list(self._active):
                try:
                    self.engine.abort_request(rid)
                except Exception:  # noqa: BLE001
                    log.exception("abort of %s failed", rid)
            self._active.clear()
            self._progress_at = time.monotonic()
            self._stats = self.engine.stats()
            return [], failed, False
        self._progress_at = time.monotonic()
        self._worked_since_trim = True
        after = self.engine.stats()  # NOTE: once per step: it snapshots every histogram
        self._stall.note(self._progress_at - started, self._stats, after)
        self._stats = after
        for out in outputs:
            # NOTE: an engine may keep mutating a request's metrics object (LLMEngine's output
            # processor hands out snapshots already; a fake may not); consumers on the event
            # loop get a snapshot that matches this output.
            if out.metrics is not None:
                out.metrics = copy.copy(out.metrics)
            if out.finished:
                self._active.discard(out.request_id)
        stuck = not outputs and after.steps == steps_before
        return outputs, [], stuck

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        if self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            pass

    # ---- delivery (event loop) ---------------------------------------------------------------
    def _deliver(self, settled, outputs: list[RequestOutput], failed) -> None:
        for future, error in settled:
            if not future.done():
                future.set_result(None) if error is None else future.set_exception(error)
        for out in outputs:
            notify_observers(self._observers, out)
            q = self._queues.get(out.request_id)
            if q is not None:
                q.put_nowait(out)
                if out.finished:
                    del self._queues[out.request_id]
        for request_id, message in failed:
            q = self._queues.pop(request_id, None)
            if q is not None:
                q.put_nowait(RequestFailed(message))

    def _fail_all(self, reason: str) -> None:
        for future in list(self._pending_adds):
            if not future.done():
                future.set_exception(EngineDeadError(reason))
        for q in self._queues.values():
            q.put_nowait(EngineDeadError(reason))
        self._queues.clear()


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if not future.done():
        future.set_result(result) if error is None else future.set_exception(error)

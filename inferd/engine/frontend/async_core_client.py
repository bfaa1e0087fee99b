"""The server's engine client when the engine core runs in its own process (`inferd serve`'s
default), or N cores with data parallelism (`--data-parallel-size N`).

    event loop: route ─add_request─▶ InputProcessor ─▶ router ─Add─▶ core i (its own process)
    event loop: ◀── queue ◀── OutputProcessor ◀── Outputs ◀──────────────────── core i

The front end (this process) tokenizes, checks, routes, detokenizes, finds stop strings and
builds `RequestOutput`s on the event loop; each core only steps. The event loop itself watches
each core's socket (core_process.py `read_on`), so a message is handled where it arrives. An
add returns once the core acknowledged it (so a refusal is still a 400 before anything
streams); an abort is sent at once and the core applies it before its next step; a stop string
found here ends its sample in the core the same way.

A core that dies fails its own requests (in flight: an error in their stream; adds awaiting an
answer: EngineDeadError, a 503) and is routed around; the client is dead, and /health fails,
once every core is. `on_dead` lets the server exit then. `AsyncEngine` (async_engine.py) is this
client with one core in a thread of this process, whose engine tokenizes and detokenizes itself.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from inferd.engine.frontend.dp_router import NoReplica, Router
from inferd.engine.frontend.input_processor import InputLimits, InputProcessor
from inferd.engine.frontend.output_processor import OutputProcessor
from inferd.engine.frontend.replica_stats import merge_stats
from inferd.engine.kv_tiers.open_tiers import wants_tiers
from inferd.engine.transport import ipc
from inferd.engine.transport.contract import CoreClient
from inferd.engine.transport.core_process import CoreProcess
from inferd.engine_client import (
    EngineStats,
    ModelInfo,
    PromptInput,
    TokenizerLike,
    TraceFiles,
    notify_observers,
)
from inferd.engine_snapshot import EngineSnapshot
from inferd.errors import (
    EngineDeadError,
    InvalidRequest,
    ModelAsleep,
    RequestFailed,
    RequestsRunning,
)
from inferd.multimodal.image_processor import image_preprocessor
from inferd.outputs import RequestOutput
from inferd.pooling_params import PoolingParams
from inferd.sampling_params import SamplingParams

log = logging.getLogger(__name__)

NO_KV_TIERS = ("this server keeps no KV tiers: start it with --kv-offload-memory or "
               "--kv-offload-dir/--kv-offload-disk")  # fmt: skip


@dataclass
class CoreReplica:
    process: CoreClient  # a CoreProcess; in-process (async_engine.py) a CoreThread
    active: set[str] = field(default_factory=set)  # requests it runs: its load
    stats: EngineStats | None = None
    stall_bound: float = 60.0
    heard_at: float = field(default_factory=time.monotonic)  # last message, or work arriving
    dead: str | None = None


def replica_configs(config, size: int, cpu_count: int | None = None,
                    gpu_count: int | None = None) -> list:  # fmt: skip
    """One EngineConfig per replica: each with its share of the cores (threads set so that
    replicas × tensor-parallel ranks × threads <= cores), on CUDA each on a GPU of its own
    while there are enough (`replica_gpus`)."""
    if size < 1:
        raise ValueError(f"--data-parallel-size must be a positive integer, got {size}")
    if size == 1:
        return [config]
    cores = cpu_count or os.cpu_count() or 1
    processes = size * config.tensor_parallel_size
    threads = config.num_threads or cores // processes
    if threads < 1 or processes * threads > cores:
        raise ValueError(
            f"--data-parallel-size {size} x --tensor-parallel-size "
            f"{config.tensor_parallel_size} x {threads} thread(s) needs more than the {cores} "
            f"CPU cores here: lower one of them (or --threads)"
        )
    if config.device and config.device.startswith("cuda"):
        gpus = gpu_count if gpu_count is not None else _visible_gpus()
        return [replace(config, num_threads=threads, device=f"cuda:{g}")
                for g in replica_gpus(size, gpus, config.gpu_memory_utilization)]  # fmt: skip
    return [replace(config, num_threads=threads) for _ in range(size)]


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count()  # NOTE: asks the driver; creates no CUDA context here


def replica_gpus(size: int, gpus: int, utilization: float) -> list[int]:
    """The GPU of each replica: one each while there are enough, else replicas share GPUs in
    turn; sharing replicas each take `utilization` of the whole GPU (as in vLLM), so together
    they must fit in it."""
    if gpus < 1:
        raise ValueError("--device cuda: no CUDA device is visible")
    sharing = -(-size // gpus)
    if sharing > 1 and sharing * utilization > 1:
        raise ValueError(
            f"--data-parallel-size {size} on {gpus} GPU(s) puts {sharing} replicas on one GPU, "
            f"each taking --gpu-memory-utilization {utilization:g} of it: set it to at most "
            f"{1 / sharing:.2f} (or use more GPUs)"
        )
    return [i % gpus for i in range(size)]


class AsyncCoreClient:
    def __init__(self, config, data_parallel_size: int = 1, routing: str = "prefix",
                 stall_timeout: float = 60.0):  # fmt: skip
        from inferd.loader import open_checkpoint
        from inferd.tokenizer import checkpoint_tokenizer

        self.config, self.routing, self.stall_timeout = config, routing, stall_timeout
        self._configs = replica_configs(config, data_parallel_size)
        Router(routing, 1, b"", 1)  # a bad policy name fails before anything starts
        # The front end's own view of the model: its tokenizer (templates, detokenizing) and
        # configuration; the cores load the weights.
        self.checkpoint = open_checkpoint(config.model)
        self.model_config = self.checkpoint.config
        self._tokenizer = checkpoint_tokenizer(self.checkpoint)
        self.checkpoint.release_file_pages()  # the front end reads no weights
        self._track([CoreReplica(CoreProcess(i)) for i in range(data_parallel_size)])

    def _track(self, replicas: list[CoreReplica]) -> None:
        """The event loop's view of the cores and of the requests they run."""
        self.replicas = replicas
        self.on_dead: Callable[[], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._observers: list[Callable[[RequestOutput], None]] = []
        self._queues: dict[str, asyncio.Queue] = {}
        self._acks: dict[str, asyncio.Future] = {}
        self._replica_of: dict[str, CoreReplica] = {}
        self._calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self._dead_reason: str | None = None
        # Sleep (inferd.engine_client.SleepClient): the level every live core sleeps at, set
        # before the cores are asked so that no request slips in meanwhile; one change at a time.
        self._sleep_level = 0
        self._sleep_change = asyncio.Lock()
        self.wake_on_request = False  # the server's --wake-on-request

    # ---- start-up (blocking: before the server listens) --------------------------------------
    def launch(self) -> None:
        """Start every core and wait until each has loaded its model; a failure stops them all
        and raises the core's error."""
        try:
            for replica, config in zip(self.replicas, self._configs, strict=True):
                replica.process.start(config, self.stall_timeout)
            readies = [r.process.wait_ready() for r in self.replicas]
        except BaseException:
            for replica in self.replicas:
                replica.process.stop(5)
            raise
        first = readies[0]
        self._model_info = first.model_info
        self.max_model_len = min(r.max_model_len for r in readies)
        self.max_num_seqs = first.max_num_seqs
        self.max_num_batched_tokens = first.max_num_batched_tokens
        limits = InputLimits.of(self.config, self.model_config.vocab_size, self.max_model_len)
        images = image_preprocessor(self.model_config, self.config)
        self.inputs = InputProcessor(self._tokenizer, limits, self._model_info.pooling, images)
        self.outputs = OutputProcessor(self._tokenizer, self.config.stream_interval)
        self.router = Router(self.routing, first.block_size, first.hash_root,
                             sum(r.num_blocks for r in readies),
                             slack=max(4, self.max_num_seqs // 8))  # fmt: skip
        self.pids = [r.pid for r in readies]

    # ---- what the server may ask (event loop) ------------------------------------------------
    @property
    def model_info(self) -> ModelInfo:
        return self._model_info

    @property
    def tokenizer(self) -> TokenizerLike:
        return self._tokenizer

    def observe_outputs(self, callback: Callable[[RequestOutput], None]) -> None:
        self._observers.append(callback)

    def start(self) -> None:
        """Read the cores' messages on the running event loop (and stop() on that loop too)."""
        self._loop = loop = asyncio.get_running_loop()
        for replica in self.replicas:
            replica.process.read_on(loop, lambda message, r=replica: self._on_message(r, message))

    def stop(self, timeout: float = 30.0) -> None:
        for replica in self.replicas:
            replica.dead = replica.dead or "the engine stopped"
            replica.process.stop(timeout)
        self._fail(set(self._queues) | set(self._acks), EngineDeadError("the engine stopped"))

    @property
    def dead_reason(self) -> str | None:
        """Why the client can serve nothing (every core is dead), or None."""
        return self._dead_reason

    def health(self) -> str | None:
        """None when healthy: at least one core alive, and none of them silent for longer than
        its stall bound while it has requests."""
        if self._dead_reason is not None:
            return self._dead_reason
        if self._loop is None:
            return "the engine is not running"
        now, problems = time.monotonic(), []
        for i, r in enumerate(self.replicas):
            silent = now - r.heard_at
            if r.dead is None and r.active and silent > r.stall_bound:
                problems.append(f"{self._name(i)} made no progress for {silent:.0f} s with "
                                f"requests pending (a step may take up to "
                                f"{r.stall_bound:.0f} s here)")  # fmt: skip
        return "; ".join(problems) or None

    def _name(self, index: int) -> str:
        return f"engine core {index}"

    def stats(self) -> EngineStats:
        return merge_stats(self.replica_stats())

    def replica_stats(self) -> list[EngineStats]:
        """The latest stats of each core (a dead one's last, with nothing running)."""
        out = []
        for r in self.replicas:
            stats = r.stats or EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0, 0)
            out.append(stats if r.dead is None else replace(stats, num_running=0, num_waiting=0))
        return out

    # ---- requests (event loop) ---------------------------------------------------------------
    async def add_request(
        self,
        request_id: str,
        prompt: PromptInput,
        params: SamplingParams | PoolingParams,
        outputs: asyncio.Queue,
        arrival_time: float | None = None,
    ) -> None:
        if self._dead_reason is not None or self._loop is None:
            raise EngineDeadError(self._dead_reason or "the engine is not running")
        if request_id in self._replica_of:
            raise InvalidRequest(None, f"request_id {request_id!r} is already in use")
        while self._sleep_level:  # NOTE: a loop: another sleep may come while this one wakes
            if not self.wake_on_request:
                raise ModelAsleep(f"the model is asleep (level {self._sleep_level}): POST "
                                  "/wake_up (or start the server with "
                                  "--wake-on-request)")  # fmt: skip
            await self.wake_up()
        replica, send = self._admit(request_id, prompt, params, arrival_time)
        future = self._loop.create_future()
        self._acks[request_id], self._queues[request_id] = future, outputs
        self._replica_of[request_id] = replica
        if not replica.active:
            replica.heard_at = time.monotonic()  # a stall is measured from when work arrives
        replica.active.add(request_id)
        send()
        try:
            await future
        except asyncio.CancelledError:
            self.abort(request_id)  # the add may still succeed; the abort follows it in order
            raise
        except BaseException:
            self._forget(request_id)
            raise
        finally:
            self._acks.pop(request_id, None)

    def _admit(self, request_id: str, prompt: PromptInput, params: SamplingParams | PoolingParams,
               arrival_time: float | None) -> tuple[CoreReplica, Callable[[], None]]:  # fmt: skip
        """Check and tokenize the request, choose its core: (that core, what sends the Add)."""
        request, text = self.inputs.make_request(request_id, prompt, params, arrival_time)
        try:
            message = ipc.encode(ipc.Add(request))
        except (OverflowError, TypeError, ValueError) as e:  # e.g. a grammar's 100-digit number
            raise InvalidRequest(None, f"the request cannot be passed to the engine: {e}") from e
        loads = [None if r.dead else len(r.active) for r in self.replicas]
        try:
            replica = self.replicas[self.router.choose(request.prompt_token_ids,
                                                       request.cache_salt, loads,
                                                       request.lora_request)]  # fmt: skip
        except NoReplica as e:
            raise EngineDeadError(str(e)) from e
        self.outputs.add_request(request_id, text, request.prompt_token_ids,
                                 request.pooling or params, request.arrival_time,
                                 getattr(params, "max_tokens", None), stream=True)  # fmt: skip
        return replica, lambda: replica.process.send_bytes(message)

    def abort(self, request_id: str) -> None:
        """Stop a request (no-op when it already finished); its queue gets no more outputs."""
        self._queues.pop(request_id, None)
        replica = self._replica_of.get(request_id)
        if replica is not None and replica.dead is None:
            replica.process.send(ipc.Abort([request_id]))

    def _forget(self, request_id: str) -> None:
        self._queues.pop(request_id, None)
        self.outputs.forget(request_id)
        replica = self._replica_of.pop(request_id, None)
        if replica is not None:
            replica.active.discard(request_id)

    # ---- profiling (inferd.engine_client.ProfilingClient) ------------------------------------
    async def start_profile(self, directory: str) -> None:
        """Every live core traces its steps into `directory` (files named by process id)."""
        await self._call_all("start_profile", directory)

    async def stop_profile(self) -> TraceFiles:
        """The first core's files (the others' lie beside them)."""
        return _typed((await self._call_all("stop_profile"))[0], TraceFiles)

    # ---- the dashboard (inferd.engine_client.SnapshotClient) ---------------------------------
    async def snapshot(self) -> EngineSnapshot:
        """The first live replica's state (with data parallelism the dashboard shows that one:
        docs/dashboard.md)."""
        live = [r for r in self.replicas if r.dead is None][:1]
        return _typed((await self._call_all("snapshot", replicas=live))[0], EngineSnapshot)

    async def rank_reports(self) -> list[dict]:
        return [r for result in await self._call_all("rank_reports") for r in result]

    # ---- KV tiers (inferd.engine_client.KVTierClient) ----------------------------------------
    async def clear_kv_tiers(self) -> int:
        """Every live core deletes every block of its tiers (each first writes what it still
        has queued, so nothing it saved before the call survives it); the blocks removed."""
        if not self._keeps_kv_tiers():
            raise InvalidRequest(None, NO_KV_TIERS)
        if self._dead_reason is not None or not any(r.dead is None for r in self.replicas):
            raise EngineDeadError(self._dead_reason or "the engine is not running")
        removed = 0
        # NOTE: one core after the other, not all at once: the replicas share their tiers'
        # folders, and a core counts a file another one deleted under it as its own removal
        # (block_store.py `_remove`), so concurrent clears would count a block once per core.
        for replica in self.replicas:
            if replica.dead is None:  # looked at now: one may have died during the last call
                (count,) = await self._call_all("clear_kv_tiers", replicas=[replica])
                removed += count
        return removed

    def _keeps_kv_tiers(self) -> bool:
        return wants_tiers(self.config)

    # ---- sleep (inferd.engine_client.SleepClient) --------------------------------------------
    async def sleep(self, level: int) -> dict[str, Any]:
        """Every live core frees its KV pool (level 2: its weights too). Refused while any
        request of this client is unfinished (RequestsRunning: they run on untouched); if a
        core fails to sleep, the others are woken again and the error is raised."""
        if level not in (1, 2) or isinstance(level, bool):
            raise InvalidRequest("level", f"level must be 1 or 2, got {level!r}")
        async with self._sleep_change:
            running = len(self._replica_of)
            if running:
                raise RequestsRunning(f"{running} request(s) are running or waiting: sleep "
                                      "frees the KV pool they use; retry once they have "
                                      "finished")  # fmt: skip
            before = self._sleep_level
            self._sleep_level = max(before, level)
            try:
                answers = await self._call_all("sleep", level)
            except BaseException:
                if before == 0:  # all or none: wake the cores that did fall asleep
                    await asyncio.gather(self._call_all("wake_up"), return_exceptions=True)
                self._sleep_level = before
                raise
            if getattr(self, "router", None) is not None:  # in-process (one core): none
                self.router.forget()  # every replica's prefix cache went with its pool
            self._note_sleep_level(self._sleep_level)
        total = {key: sum(a[key] for a in answers) for key in ("freed_bytes", "rss_before",
                                                                "rss_after")}  # fmt: skip
        return {"level": self._sleep_level, **total, "engines": answers}

    async def wake_up(self) -> dict[str, Any]:
        """Every live core takes its memory back (a core that is awake answers level 0)."""
        async with self._sleep_change:
            if not self._sleep_level:
                return {"level": 0, "seconds": 0.0, "engines": []}
            started = time.monotonic()
            answers = await self._call_all("wake_up")
            level, self._sleep_level = self._sleep_level, 0
            self._note_sleep_level(0)
        return {"level": level, "seconds": round(time.monotonic() - started, 4),
                "engines": answers}  # fmt: skip

    def is_sleeping(self) -> bool:
        return self._sleep_level > 0

    def _note_sleep_level(self, level: int) -> None:
        """Into each core's latest stats (/metrics): an idle core sends no stats of its own."""
        for r in self.replicas:
            r.stats = replace(r.stats or EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0, 0),
                              sleep_level=level)  # fmt: skip

    async def _call_all(self, method: str, *args: Any, replicas: list | None = None) -> list[Any]:
        live = [r for r in self.replicas if r.dead is None] if replicas is None else replicas
        if self._dead_reason is not None or self._loop is None or not live:
            raise EngineDeadError(self._dead_reason or "the engine is not running")
        futures = []
        for replica in live:
            call_id = next(self._call_ids)
            self._calls[call_id] = future = self._loop.create_future()
            futures.append(future)
            replica.process.send(ipc.Call(call_id, method, list(args)))
        return list(await asyncio.gather(*futures))

    # ---- the cores' messages (event loop) ----------------------------------------------------
    def _on_message(self, replica: CoreReplica, message) -> None:
        if message is None:
            self._replica_died(replica)
            return
        replica.heard_at = time.monotonic()
        if isinstance(message, ipc.CallResult):
            m = message
            return _settle(
                self._calls.pop(m.call_id, None), m.result, m.error_type, None, m.message
            )
        if not isinstance(message, ipc.Outputs):
            return
        replica.stall_bound = message.stall_bound or replica.stall_bound
        if message.stats is not None:
            replica.stats = message.stats
        for ack in message.acks:
            if ack.error_type is not None:  # refused: nothing of it runs
                self._forget(ack.request_id)
            _settle(self._acks.get(ack.request_id), None, ack.error_type, ack.param, ack.message)
        results, finishes = self.outputs.process(message.outputs, time.monotonic())
        if finishes:  # NOTE: the core ends them before its next step
            replica.process.send(ipc.Finish(finishes))
        for out in message.outputs:
            if out.finished:
                replica.active.discard(out.request_id)
        self._deliver(results)
        for failure in message.failed:  # a step raised in the core: its requests end
            self._fail({failure.request_id}, RequestFailed(failure.message))

    def _deliver(self, results: list[RequestOutput]) -> None:
        for out in results:
            notify_observers(self._observers, out)
            queue = self._queues.get(out.request_id)
            if queue is not None:
                queue.put_nowait(out)
            if out.finished:
                self._queues.pop(out.request_id, None)
                replica = self._replica_of.pop(out.request_id, None)
                if replica is not None:
                    replica.active.discard(out.request_id)

    def _replica_died(self, replica: CoreReplica) -> None:
        if replica.dead is not None:
            return
        replica.dead = replica.process.end_reason
        log.error("%s; its %d requests fail", replica.dead, len(replica.active))
        mine = {rid for rid, r in self._replica_of.items() if r is replica}
        self._fail(mine, EngineDeadError(replica.dead))
        for future in self._calls.values():  # a call it will never answer
            if not future.done():
                future.set_exception(EngineDeadError(replica.dead))
        self._calls.clear()
        replica.process.stop(1)
        if all(r.dead is not None for r in self.replicas):
            self._dead_reason = "; ".join(r.dead for r in self.replicas)
            self._fail(set(self._queues) | set(self._acks), EngineDeadError(self._dead_reason))
            if self.on_dead is not None:
                self.on_dead()

    def _fail(self, request_ids: set[str], error: BaseException) -> None:
        for rid in request_ids:
            future = self._acks.pop(rid, None)
            if future is not None and not future.done():
                future.set_exception(error)
            queue = self._queues.get(rid)
            if queue is not None:
                queue.put_nowait(error)
            self._forget(rid)


def _settle(future: asyncio.Future | None, result: Any, error_type: str | None,
            param: str | None, message: str) -> None:  # fmt: skip
    if future is None or future.done():
        return
    if error_type is None:
        future.set_result(result)
    else:
        future.set_exception(ipc.rebuild_error(error_type, param, message))


def _typed(result: Any, kind: type) -> Any:
    """A call's result as `kind` (across a process it arrives as plain data)."""
    return result if isinstance(result, kind) else msgspec.convert(result, kind)

"""The servable models and which of them are loaded: load on request; unload the least recently
used idle models when `--max-loaded-models` or `--max-loaded-memory` needs room; unload a model
once it has been idle for its keep-alive (the last request's Ollama `keep_alive`, else
`--idle-unload`).

A model's states: available (not loaded) → loading → loaded → unloading → available. A load
runs the loader (which starts the model's engine and builds its app, blocking: a worker thread)
and then the app's start-up (its lifespan) on the event loop; a failed load leaves the model
available with the loader's message, which the requests that waited for it get (a later request
tries again). Unloading stops the model's engine in a worker thread too (`stop_engine`), then
runs the app's shutdown. Loading and unloading models hold seats and memory too: the limits
bound the engines alive at any moment, so memory never holds one more model than asked for.

The memory budget (memory.py says what a model's figure is): before a model loads, its estimate
(`estimator`, once per model, in a worker thread) must fit beside what the other models hold
(measured once loaded, estimated while loading); a model that alone exceeds the budget fails
its own requests (ModelTooLarge). Room is made only by unloading idle models, least recently
used first, and only when that is enough: a request that needs a busy model's room waits for it
to become idle (bounded by the dispatcher's --max-queue-time).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from inferd.server.multimodel.memory import ModelMemory, size_text

log = logging.getLogger(__name__)

AVAILABLE, LOADING, LOADED, UNLOADING = "available", "loading", "loaded", "unloading"


class ModelLoadError(Exception):
    """The model's load failed; the message is the loader's."""


class ModelTooLarge(ModelLoadError):
    """The model alone needs more than the memory budget."""


@dataclass
class ModelSlot:
    name: str
    path: str
    state: str = AVAILABLE
    app: Any = None  # the model's ASGI app (server/app.py) while loaded
    in_flight: int = 0  # requests forwarded to the app and not yet ended
    last_used: float = 0.0  # time.monotonic() when the last request began or ended
    error: str | None = None  # why the last load failed (or the engine died), if it did
    loaded_at: float | None = None  # time.time() of the last load, for /v1/models
    # The last request's keep-alive in seconds (Ollama's keep_alive): None for the server's
    # --idle-unload, negative for never.
    keep_alive_s: float | None = None
    estimate: ModelMemory | None = None  # before the load (kept: the settings do not change)
    measured: ModelMemory | None = None  # while loaded
    _lifespan: Any = None
    _ready: asyncio.Future | None = None  # the load in progress
    _unloading: asyncio.Task | None = None
    _estimating: asyncio.Future | None = None

    @property
    def memory(self) -> ModelMemory | None:
        """What the budget counts for this model now."""
        return self.measured or self.estimate


@dataclass
class ModelPool:
    slots: dict[str, ModelSlot]
    # (name, path) → the model's app, not yet started; blocking (runs in a worker thread)
    loader: Callable[[str, str], Any]
    max_loaded: int
    idle_unload_s: float | None = None
    metrics: Any = None  # metrics.ModelMetrics, or None
    max_memory: int | None = None  # --max-loaded-memory, in bytes
    # (name, path) → the model's estimated memory; blocking (a worker thread). Needed with
    # max_memory.
    estimator: Callable[[str, str], ModelMemory] | None = None
    # the loaded app → its memory as its engine reports it (None: cannot tell)
    measure: Callable[[Any], Awaitable[ModelMemory | None]] | None = None
    # the loaded app → stops its engine without blocking the event loop (before the app's
    # shutdown, which then finds the engine stopped); None: the shutdown does it all
    stop_engine: Callable[[Any], Awaitable[None]] | None = None
    draining: bool = False
    _changed: asyncio.Event | None = field(default=None, repr=False)

    def names(self) -> list[str]:
        return list(self.slots)

    def loaded(self) -> list[ModelSlot]:
        return [s for s in self.slots.values() if s.state == LOADED]

    async def acquire(self, name: str, keep_alive_s: float | None = None) -> ModelSlot:
        """The loaded model `name`, with one more request in flight (give it back with release);
        loads it first when needed, waiting for room. `keep_alive_s`: the request's keep-alive
        (None: the server's). Raises ModelLoadError (ModelTooLarge)."""
        slot = self.slots[name]
        while True:
            if slot.state == LOADED:
                slot.in_flight += 1
                slot.last_used = time.monotonic()
                slot.keep_alive_s = keep_alive_s
                return slot
            if slot.state == LOADING:
                # NOTE: shielded: a request that gives up (disconnect, --max-queue-time) must
                # not cancel the load the others wait for.
                await asyncio.shield(slot._ready)
                continue
            if slot.state == UNLOADING:
                await asyncio.shield(slot._unloading)
                continue
            if self.max_memory is not None and slot.estimate is None:
                await self._estimate(slot)
                continue
            self._check_alone(slot)
            victims = self._room_for(slot)
            if victims == []:
                self._start_load(slot)
            elif victims:
                await asyncio.shield(self._start_unload(victims[0], "room for " + name))
            else:  # only busy models could make room: wait for a request to end somewhere
                await self._event().wait()

    def release(self, slot: ModelSlot) -> None:
        slot.in_flight -= 1
        slot.last_used = time.monotonic()
        if slot.in_flight == 0 and slot.state == LOADED and self._expired(slot, slot.last_used):
            self._start_unload(slot, "keep_alive 0")  # Ollama: unload right after the request
        self._notify()

    # ---- room: seats and memory -------------------------------------------------------------
    def memory_used(self) -> int:
        """Bytes the budget counts for the models loading, loaded or unloading."""
        return sum(s.memory.total for s in self.slots.values()
                   if s.state != AVAILABLE and s.memory is not None)  # fmt: skip

    def _check_alone(self, slot: ModelSlot) -> None:
        if self.max_memory is None or slot.estimate is None:
            return
        if slot.estimate.total > self.max_memory:
            raise ModelTooLarge(
                f"the model {slot.name!r} needs about {size_text(slot.estimate.total)} "
                f"({slot.estimate.describe()}), more than --max-loaded-memory "
                f"({size_text(self.max_memory)}) holds even with no other model loaded: raise "
                "--max-loaded-memory, or lower --kv-cache-memory or --max-num-seqs"
            )

    def _room_for(self, slot: ModelSlot) -> list[ModelSlot] | None:
        """The idle models to unload (least recently used first) so that `slot` fits both
        limits: [] when it fits now, None when unloading every idle model would not do."""
        need = slot.estimate.total if self.max_memory is not None and slot.estimate else 0
        seats = sum(s.state != AVAILABLE for s in self.slots.values())
        used = self.memory_used()
        idle = sorted((s for s in self.loaded() if s.in_flight == 0), key=lambda s: s.last_used)
        victims: list[ModelSlot] = []
        while seats >= self.max_loaded or (self.max_memory is not None
                                           and used + need > self.max_memory):  # fmt: skip
            if not idle:
                return None
            victim = idle.pop(0)
            victims.append(victim)
            seats -= 1
            used -= victim.memory.total if victim.memory else 0
        return victims

    async def _estimate(self, slot: ModelSlot) -> None:
        if slot._estimating is None:
            slot._estimating = asyncio.ensure_future(
                asyncio.to_thread(self.estimator, slot.name, slot.path)  # type: ignore[arg-type]
            )
        task = slot._estimating
        try:
            estimate = await asyncio.shield(task)
        except Exception as e:  # the file cannot be read: the load would fail the same way
            if slot._estimating is task:  # counted once, however many requests waited
                slot._estimating = None
                slot.error = f"{type(e).__name__}: {e}"
                log.error("the model %s cannot be estimated: %s", slot.name, slot.error)
                if self.metrics:
                    self.metrics.load_failed(slot.name)
            raise ModelLoadError(f"the model {slot.name!r} failed to load: {slot.error}") from e
        if slot.estimate is None:
            slot.estimate = estimate
            log.info("the model %s needs about %s (%s)", slot.name,
                     size_text(estimate.total), estimate.describe())  # fmt: skip

    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _notify(self) -> None:
        event, self._changed = self._changed, None
        if event is not None:
            event.set()

    # ---- load -------------------------------------------------------------------------------
    def _start_load(self, slot: ModelSlot) -> None:
        slot.state, slot.error = LOADING, None
        slot._ready = asyncio.get_running_loop().create_future()
        # nobody may await a failed load (its requests gave up): no "never retrieved" warning
        slot._ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        asyncio.ensure_future(self._load(slot))

    async def _load(self, slot: ModelSlot) -> None:
        started = time.perf_counter()
        log.info("loading the model %s (%s)", slot.name, slot.path)
        try:
            app = await asyncio.to_thread(self.loader, slot.name, slot.path)
            lifespan = app.router.lifespan_context(app)
            await lifespan.__aenter__()  # the engine client starts reading its cores
        except Exception as e:  # a bad file, a full memory: this model's requests fail
            slot.state, slot.error = AVAILABLE, f"{type(e).__name__}: {e}"
            log.error("the model %s failed to load: %s", slot.name, slot.error)
            if self.metrics:
                self.metrics.load_failed(slot.name)
            slot._ready.set_exception(ModelLoadError(
                f"the model {slot.name!r} failed to load: {slot.error}"))  # fmt: skip
            self._notify()
            return
        seconds = time.perf_counter() - started
        slot.app, slot._lifespan = app, lifespan
        slot.loaded_at, slot.last_used = time.time(), time.monotonic()
        if self.measure is not None:
            try:
                slot.measured = await self.measure(app)
            except Exception:  # the engine died meanwhile: its watch unloads it
                log.exception("measuring the model %s", slot.name)
            if slot.measured is not None and slot.estimate is not None:
                # nothing measures the runtime part apart: one estimate for it, before and after
                slot.measured = replace(slot.measured, runtime=slot.estimate.runtime)
        slot.state = LOADED
        self._watch_engine(slot)
        log.info("loaded the model %s in %.1f s%s", slot.name, seconds,
                 f" ({slot.measured.describe()})" if slot.measured else "")  # fmt: skip
        if self.metrics:
            self.metrics.loaded(slot.name, seconds)
        slot._ready.set_result(None)
        self._over_budget(slot)
        self._notify()

    def _over_budget(self, loaded: ModelSlot) -> None:
        """When the measured figure came out above the estimate and the budget no longer
        holds, unload idle others (least recently used first) until it does."""
        if self.max_memory is None:
            return
        used = self.memory_used()
        idle = sorted((s for s in self.loaded() if s.in_flight == 0 and s is not loaded),
                      key=lambda s: s.last_used)  # fmt: skip
        while used > self.max_memory and idle:
            victim = idle.pop(0)
            used -= victim.memory.total if victim.memory else 0
            self._start_unload(victim, "the memory budget, after measuring " + loaded.name)

    def _watch_engine(self, slot: ModelSlot) -> None:
        """A model whose engine dies is unloaded (its requests already got their errors); the
        next request for it loads it again."""
        client = slot.app.state.inferd.client
        if not hasattr(client, "on_dead"):
            return

        def dead() -> None:
            slot.error = f"its engine died: {getattr(client, 'dead_reason', None)}"
            if slot.state == LOADED:
                self._start_unload(slot, "its engine died")

        client.on_dead = dead

    # ---- unload -----------------------------------------------------------------------------
    def _start_unload(self, slot: ModelSlot, why: str) -> asyncio.Task:
        slot.state = UNLOADING
        slot._unloading = asyncio.ensure_future(self._unload(slot, why))
        return slot._unloading

    async def _unload(self, slot: ModelSlot, why: str) -> None:
        log.info("unloading the model %s (%s)", slot.name, why)
        try:
            if self.stop_engine is not None:  # NOTE: the blocking part, off the event loop
                await self.stop_engine(slot.app)
            # the app's own shutdown: its batches end, then its engine client stops its cores
            await slot._lifespan.__aexit__(None, None, None)
        except Exception:
            log.exception("unloading the model %s", slot.name)
        finally:
            slot.app, slot._lifespan, slot.state, slot.measured = None, None, AVAILABLE, None
            slot.keep_alive_s = None  # a keep_alive holds for the load it was sent to
            if self.metrics:
                self.metrics.unloaded(slot.name)
            self._notify()

    async def expire(self, name: str) -> bool:
        """Unload `name` as soon as it is idle (Ollama's keep_alive 0 with nothing to run: what
        `ollama stop` sends); waits for the unload when it is idle now. Whether it was loaded."""
        slot = self.slots[name]
        if slot.state not in (LOADING, LOADED):
            return False
        slot.keep_alive_s = 0.0
        if slot.state == LOADED and slot.in_flight == 0:
            await asyncio.shield(self._start_unload(slot, "keep_alive 0"))
        return True

    # ---- keep-alive -------------------------------------------------------------------------
    def keep_alive_of(self, slot: ModelSlot) -> float | None:
        """Seconds an idle `slot` stays loaded; None: until it is needed for room."""
        keep = slot.keep_alive_s if slot.keep_alive_s is not None else self.idle_unload_s
        return None if keep is None or keep < 0 else keep

    def expires_at(self, slot: ModelSlot) -> float | None:
        """The time.monotonic() at which the loaded `slot` unloads if no request comes (for a
        busy one: if its requests ended now); None: never by itself."""
        keep = self.keep_alive_of(slot)
        if keep is None:
            return None
        return (time.monotonic() if slot.in_flight else slot.last_used) + keep

    def _expired(self, slot: ModelSlot, now: float) -> bool:
        when = self.expires_at(slot)
        return when is not None and when <= now

    async def run_expiry(self) -> None:
        """Unload each idle model when its keep-alive runs out (runs for the server's life)."""
        while True:
            now = time.monotonic()
            soonest = None
            for slot in self.loaded():
                if slot.in_flight or (when := self.expires_at(slot)) is None:
                    continue
                if when <= now:
                    self._start_unload(slot, "idle for its keep-alive")
                else:
                    soonest = when if soonest is None else min(soonest, when)
            # woken by any change (a request began or ended, a model loaded) or the next expiry
            wait = None if soonest is None else max(soonest - now, 0.001)
            try:
                await asyncio.wait_for(self._event().wait(), wait)
            except TimeoutError:
                pass

    async def close(self) -> None:
        """Unload every model (server shutdown); loads in progress finish first."""
        for slot in self.slots.values():
            if slot.state == LOADING:
                await asyncio.gather(asyncio.shield(slot._ready), return_exceptions=True)
            if slot.state == UNLOADING:
                await asyncio.shield(slot._unloading)
            if slot.state == LOADED:
                await self._start_unload(slot, "shutdown")

"""The servable models and which of them are loaded: load on request, least-recently-used unload
when `--max-loaded-models` needs room, unload after `--idle-unload` seconds without requests.

A model's states: available (not loaded) → loading → loaded → unloading → available. A load
runs the loader (which starts the model's engine and builds its app, blocking: a worker thread)
and then the app's start-up (its lifespan) on the event loop; a failed load leaves the model
available with the loader's message, which the requests that waited for it get (a later request
tries again). Loading and unloading models hold seats too: `max_loaded` bounds the engines alive
at any moment, so memory never holds one more model than asked for.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inferd.engine_client import SnapshotClient

log = logging.getLogger(__name__)

AVAILABLE, LOADING, LOADED, UNLOADING = "available", "loading", "loaded", "unloading"


class ModelLoadError(Exception):
    """The model's load failed; the message is the loader's."""


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
    _lifespan: Any = None
    _ready: asyncio.Future | None = None  # the load in progress
    _unloading: asyncio.Task | None = None


@dataclass
class ModelPool:
    slots: dict[str, ModelSlot]
    # (name, path) → the model's app, not yet started; blocking (runs in a worker thread)
    loader: Callable[[str, str], Any]
    max_loaded: int
    idle_unload_s: float | None = None
    metrics: Any = None  # metrics.ModelMetrics, or None
    draining: bool = False
    _changed: asyncio.Event | None = field(default=None, repr=False)

    def names(self) -> list[str]:
        return list(self.slots)

    def loaded(self) -> list[ModelSlot]:
        return [s for s in self.slots.values() if s.state == LOADED]

    async def acquire(self, name: str) -> ModelSlot:
        """The loaded model `name`, with one more request in flight (give it back with release);
        loads it first when needed, waiting for a seat. Raises ModelLoadError."""
        slot = self.slots[name]
        while True:
            if slot.state == LOADED:
                slot.in_flight += 1
                slot.last_used = time.monotonic()
                return slot
            if slot.state == LOADING:
                # NOTE: shielded: a request that gives up (disconnect, --max-queue-time) must
                # not cancel the load the others wait for.
                await asyncio.shield(slot._ready)
                continue
            if slot.state == UNLOADING:
                await asyncio.shield(slot._unloading)
                continue
            if self._seats_taken() < self.max_loaded:
                self._start_load(slot)
                continue
            victim = self._least_recently_used_idle()
            if victim is not None:
                await asyncio.shield(self._start_unload(victim, "room for " + name))
            else:  # every seat busy: wait for a request to end somewhere
                await self._event().wait()

    def release(self, slot: ModelSlot) -> None:
        slot.in_flight -= 1
        slot.last_used = time.monotonic()
        self._notify()

    def _seats_taken(self) -> int:
        return sum(s.state != AVAILABLE for s in self.slots.values())

    def _least_recently_used_idle(self) -> ModelSlot | None:
        idle = [s for s in self.loaded() if s.in_flight == 0]
        return min(idle, key=lambda s: s.last_used) if idle else None

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
        else:
            seconds = time.perf_counter() - started
            slot.app, slot._lifespan, slot.state = app, lifespan, LOADED
            slot.loaded_at, slot.last_used = time.time(), time.monotonic()
            self._watch_engine(slot)
            log.info("loaded the model %s in %.1f s", slot.name, seconds)
            if self.metrics:
                self.metrics.loaded(slot.name, seconds)
            slot._ready.set_result(None)
        self._notify()

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
            # the app's own shutdown: its batches end, then its engine client stops its cores
            await slot._lifespan.__aexit__(None, None, None)
        except Exception:
            log.exception("unloading the model %s", slot.name)
        finally:
            slot.app, slot._lifespan, slot.state = None, None, AVAILABLE
            if self.metrics:
                self.metrics.unloaded(slot.name)
            self._notify()

    async def unload_idle(self) -> None:
        """Unload the models idle for `idle_unload_s` (called periodically)."""
        if self.idle_unload_s is None:
            return
        now = time.monotonic()
        for slot in self.loaded():
            if slot.in_flight == 0 and now - slot.last_used >= self.idle_unload_s:
                await asyncio.shield(self._start_unload(slot, "idle"))

    async def close(self) -> None:
        """Unload every model (server shutdown); loads in progress finish first."""
        for slot in self.slots.values():
            if slot.state == LOADING:
                await asyncio.gather(asyncio.shield(slot._ready), return_exceptions=True)
            if slot.state == UNLOADING:
                await asyncio.shield(slot._unloading)
            if slot.state == LOADED:
                await self._start_unload(slot, "shutdown")


async def memory_bytes(slot: ModelSlot) -> int | None:
    """Bytes held by a loaded model's weights and KV pool (as /api/ps and `inferd memory` say),
    or None when it is not loaded or its client cannot tell."""
    client = slot.app.state.inferd.client if slot.app is not None else None
    if not isinstance(client, SnapshotClient):
        return None
    try:
        snap = await client.snapshot()
    except Exception:  # the engine died meanwhile: memory unknown
        return None
    return snap.memory.weights + snap.memory.kv_pool

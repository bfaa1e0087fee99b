"""An engine core stepping in a thread of this process (a `CoreClient`, transport/contract.py): the
same `CoreLoop` as a core process runs, over a queue (commands in) and a callback (messages out);
nothing is encoded. Only the loop's thread touches the core once `start` has run."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from inferd.engine.core.core_loop import CoreLoop
from inferd.engine.transport import ipc

log = logging.getLogger(__name__)


class _QueueTransport:
    idle_wait_s = None  # no parent to watch: an idle loop sleeps until a command comes

    def __init__(self, send: Callable[[Any], None]):
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.send = send
        self._taken: list[Any] = []  # what `wait` took off the queue

    def wait(self, timeout: float | None) -> bool:
        try:
            self._taken.append(self.commands.get(timeout != 0, timeout))
        except queue.Empty:
            return False
        return True

    def take(self) -> list[Any]:
        taken, self._taken = self._taken, []
        while not self.commands.empty():
            taken.append(self.commands.get_nowait())  # NOTE: the loop's thread is the only reader
        return taken

    def front_end_gone(self, busy: bool) -> bool:
        return False


class CoreThread:
    def __init__(self, core, stall_timeout: float = 60.0):
        self._transport = _QueueTransport(self._emit)
        self.loop = CoreLoop(core, self._transport, stall_timeout)
        self.thread: threading.Thread | None = None
        self.end_reason: str | None = None  # why the loop ended, once it has
        self._received: queue.SimpleQueue = queue.SimpleQueue()  # for recv, until read_on
        self._reader: tuple[asyncio.AbstractEventLoop, Callable[[Any], None]] | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="inferd-engine", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        reason = "the engine loop stopped"
        try:
            self.loop.run()
        except BaseException as e:  # noqa: BLE001 - whatever ended the loop, the front end hears
            log.exception("the engine loop died")
            reason = f"the engine loop died: {type(e).__name__}: {e}"
        finally:
            self.end_reason = reason
            self._emit(None)

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def send(self, message: Any) -> None:
        self._transport.commands.put(message)

    def recv(self, timeout: float | None = None) -> Any:
        try:
            return self._received.get(timeout=timeout)
        except queue.Empty:
            return None

    def read_on(self, loop: asyncio.AbstractEventLoop, callback: Callable[[Any], None]) -> None:
        self._reader = (loop, callback)

    def _emit(self, message: Any) -> None:  # on the loop's thread
        if self._reader is None:
            return self._received.put(message)
        loop, callback = self._reader
        try:
            loop.call_soon_threadsafe(callback, message)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            pass

    def stop(self, timeout: float = 30.0) -> None:
        self.send(ipc.Stop())
        if self.thread is not None:
            self.thread.join(timeout)

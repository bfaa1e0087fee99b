"""`CoreClient`: what a front end holds of an engine core that steps on its own loop (core_loop.py
`CoreLoop.run`), speaking the ipc messages. `CoreProcess` (core_process.py): the core in a process
of its own, encoded over a socket and a pipe. `CoreThread` (core_thread.py): in a thread here,
over a queue and a callback."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol


class CoreClient(Protocol):
    alive: bool
    end_reason: str | None  # why the core serves no more, once read_on's callback got None

    def send(self, message: Any) -> None: ...  # ipc.Add / Abort / Finish / Call / Stop

    def recv(self, timeout: float | None = None) -> Any: ...  # a blocking reader's: None if none

    def read_on(self, loop: asyncio.AbstractEventLoop, callback: Callable[[Any], None]) -> None:
        """`loop` hands every message to `callback`, and None once the core has ended."""

    def stop(self, timeout: float = ...) -> None: ...

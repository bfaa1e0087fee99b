"""What a front end holds of an engine core that steps on its own: the `CoreClient` contract.

    send(message)             ipc.Add / Abort / Finish / Call / Stop; never blocks
    recv(timeout)             the core's next message (ipc.Outputs, CallResult), for a blocking
                              caller (process_core.py), or None after `timeout`
    read_on(loop, callback)   or: `loop` hands every message to `callback`, and None once the
                              core has ended (the asyncio clients: core_client.py, async_engine.py)
    alive, stop(timeout)

Both implementations run the same step loop (core_loop.py `CoreLoop.run`) and speak the same ipc
messages: `CoreProcess` (core_process.py) in a process of its own, encoded over a socket and a
pipe; `CoreThread` (core_thread.py) in a thread of this process, over a queue and a callback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol


class CoreClient(Protocol):
    @property
    def alive(self) -> bool: ...

    def send(self, message: Any) -> None: ...

    def recv(self, timeout: float | None = None) -> Any: ...

    def read_on(self, loop: asyncio.AbstractEventLoop,
                callback: Callable[[Any], None]) -> None: ...  # fmt: skip

    def stop(self, timeout: float = ...) -> None: ...

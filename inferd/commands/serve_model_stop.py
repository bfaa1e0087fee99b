"""Stopping one model's engine without blocking the server's event loop (a server of many models
unloads models while it serves the others).

The engine client's own `stop()` (run by the model's app's shutdown) sends each core a Stop and
then waits for it to end, on the calling thread: the event loop, for a second or more while a
core process frees its model. So the pool first asks every core to stop, on the loop (a send,
never blocking; each core is marked stopped first, so its end reads as a stop and not as a
death), and waits for the cores to end in a worker thread; the shutdown that follows then finds
them ended and only closes their sockets. A client of another kind (a test's fake) is left to
its shutdown.
"""

from __future__ import annotations

import asyncio
import time

STOP_TIMEOUT_S = 30.0  # as the client's own stop(): past it, the shutdown kills the core


async def stop_engine(app) -> None:
    from inferd.engine.frontend.async_core_client import AsyncCoreClient
    from inferd.engine.transport import ipc

    client = app.state.inferd.client
    if not isinstance(client, AsyncCoreClient):
        return
    cores = []
    for replica in client.replicas:
        if replica.dead is None and replica.process.alive:
            replica.dead = "the engine stopped"
            replica.process.send(ipc.Stop())
            cores.append(replica.process)
    await asyncio.to_thread(_wait_ended, cores, STOP_TIMEOUT_S)


def _wait_ended(cores: list, timeout: float) -> None:
    """Blocking: until every core has ended, or `timeout` seconds."""
    deadline = time.monotonic() + timeout
    for core in cores:
        while core.alive and time.monotonic() < deadline:
            time.sleep(0.01)

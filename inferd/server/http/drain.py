"""Graceful shutdown: on SIGTERM or SIGINT the server stops admitting (503, and /health says it
is shutting down), lets the requests in flight finish for up to `--shutdown-timeout` seconds,
then ends those still running: a stream gets an error event and `[DONE]`, a plain request a 503.
Only then does uvicorn close the listening socket and the connections.

A second signal ends the wait at once; a third is uvicorn's own forced exit. The process exits
with status 0 after a drain (no KeyboardInterrupt traceback for SIGINT).
"""

from __future__ import annotations

import asyncio
import logging
from types import FrameType

import uvicorn

from inferd.server.http.admission import Admission, ShuttingDown

log = logging.getLogger(__name__)

FLUSH_S = 5.0  # after ending the requests: time for their last bytes to go out


class Drain:
    def __init__(self, admission: Admission, timeout_s: float):
        self.admission = admission
        self.timeout_s = timeout_s
        self._hurry: asyncio.Event | None = None

    def hurry(self) -> None:
        """Stop waiting for requests to finish: end them now."""
        if self._hurry is not None:
            self._hurry.set()

    async def run(self) -> None:
        admission = self.admission
        admission.draining = True
        self._hurry = asyncio.Event()
        if admission.live:
            log.info(
                "shutting down: refusing new requests, waiting up to %.0f s for the %d in "
                "flight (--shutdown-timeout)",
                self.timeout_s,
                len(admission.live),
            )
        await self._wait_until_idle(self.timeout_s)
        if admission.live:
            log.warning("shutting down: ending %d requests still running", len(admission.live))
            error = ShuttingDown(
                f"the server shut down before this request finished "
                f"(it waited {self.timeout_s:g} s, --shutdown-timeout)"
            )
            for reservation in list(admission.live):
                if reservation.group is not None:
                    reservation.group.fail(error)
                else:
                    reservation.release()
            self._hurry = asyncio.Event()
            await self._wait_until_idle(FLUSH_S)

    async def _wait_until_idle(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while self.admission.live and loop.time() < deadline:
            assert self._hurry is not None
            if self._hurry.is_set():
                return
            try:
                await asyncio.wait_for(self._hurry.wait(), min(0.05, deadline - loop.time()))
            except TimeoutError:
                pass


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with a drain before its own shutdown."""

    def __init__(self, config: uvicorn.Config, drain: Drain):
        super().__init__(config)
        self.drain = drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signals = 0

    async def serve(self, sockets=None) -> None:  # noqa: ANN001 - uvicorn's signature
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._loop is None or not self.started or self._signals > 2:
            return super().handle_exit(sig, frame)
        if self._signals == 1:
            self._loop.call_soon_threadsafe(self._start_drain)
        else:
            self._loop.call_soon_threadsafe(self.drain.hurry)

    def _start_drain(self) -> None:
        async def drain_then_exit() -> None:
            try:
                await self.drain.run()
            finally:
                self.should_exit = True

        self._drain_task = asyncio.ensure_future(drain_then_exit())

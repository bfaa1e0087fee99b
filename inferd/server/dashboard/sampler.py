"""What the dashboard's routes serve: the engine's snapshot, at most a few times a second however
many pages watch, and the timelines of the requests that finished lately.

    sampler = DashboardSampler(client)
    payload = await sampler.payload()     # the JSON-ready dict of /dashboard/snapshot

NOTE: nothing here runs until a dashboard route is first called. Then, and only then, the
recorder of finished requests joins the engine client's output observers (one check of
`out.finished` per output from then on), and each snapshot is one call on the engine's thread,
shared by every page that asks within `MIN_INTERVAL_S` of the last one.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from inferd.engine_client import EngineClient, SnapshotClient
from inferd.engine_snapshot import EngineSnapshot
from inferd.outputs import RequestOutput, finish_reasons
from inferd.server.metrics.timeline import timeline_json

MIN_INTERVAL_S = 0.25  # the most snapshots a second: 4, whatever the number of pages
RECENT_REQUESTS = 64  # finished requests the dashboard remembers


class RecentRequests:
    """The last finished requests' timelines, newest last (the engine forgets a request as soon
    as it finishes)."""

    def __init__(self, size: int = RECENT_REQUESTS, clock: Callable[[], float] = time.monotonic):
        self._items: deque[dict[str, Any]] = deque(maxlen=size)
        self._clock = clock

    def observe(self, out: RequestOutput) -> None:
        """Output observer (on the event loop)."""
        if out.finished and out.metrics is not None:
            self._items.append(finished_record(out, self._clock()))

    def records(self) -> list[dict[str, Any]]:
        return list(self._items)


def finished_record(out: RequestOutput, now: float) -> dict[str, Any]:
    """The request's timeline (inferd/server/metrics/timeline.py) with what the charts plot: time to
    first token, time per output token after the first, how it ended, and when."""
    record = timeline_json(out)
    m = out.metrics
    tokens = m.num_generation_tokens
    reasons = sorted({reason or "abort" for reason in finish_reasons(out)})
    record.update(
        finished_at=now,
        ttft_s=m.time_to_first_token,
        tpot_s=None if tokens < 2 or m.decode_time is None else m.decode_time / (tokens - 1),
        finish_reason=("error" if out.error else ",".join(reasons) or "abort"),
    )
    return record


class DashboardSampler:
    def __init__(self, client: EngineClient, server: dict[str, Any] | None = None,
                 min_interval: float = MIN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.client = client
        self.server = server or {}  # facts about the server the pages read (payload "server")
        self.min_interval = min_interval
        self.clock = clock
        self.recent = RecentRequests(clock=clock)
        self.builds = 0  # snapshots asked of the engine (tests read it)
        self._watching = False
        self._latest: tuple[float, dict[str, Any]] | None = None
        self._pending: asyncio.Future | None = None

    @property
    def available(self) -> bool:
        return isinstance(self.client, SnapshotClient)

    async def payload(self) -> dict[str, Any]:
        """The latest snapshot as a JSON-ready dict, with the requests finished until now and
        the server's clock; a fresh snapshot only when the last is `min_interval` old."""
        if not self._watching:
            self._watching = True
            self.client.observe_outputs(self.recent.observe)
        if self._latest is None or self.clock() - self._latest[0] >= self.min_interval:
            if self._pending is None:
                self._pending = asyncio.ensure_future(self._build())
            # NOTE: shielded: a page that goes away must not cancel the build others await.
            await asyncio.shield(self._pending)
        assert self._latest is not None
        return {**self._latest[1], "recent": self.recent.records(),
                "server_monotonic_s": self.clock(), "server": self.server}  # fmt: skip

    async def _build(self) -> None:
        try:
            self.builds += 1
            snapshot: EngineSnapshot = await self.client.snapshot()  # type: ignore[attr-defined]
            self._latest = (self.clock(), snapshot.to_dict())
        finally:
            self._pending = None

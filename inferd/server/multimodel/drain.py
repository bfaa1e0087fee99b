"""Graceful shutdown with many models: new requests are refused at the dispatcher, and every
loaded model's own drain (server/http/drain.py) runs at once, each bounded by
--shutdown-timeout; then uvicorn's shutdown unloads the models (dispatcher.py's lifespan)."""

from __future__ import annotations

import asyncio

from inferd.server.multimodel.pool import ModelPool


class PoolDrain:
    def __init__(self, pool: ModelPool):
        self.pool = pool
        self._drains: list = []

    async def run(self) -> None:
        self.pool.draining = True
        self._drains = [slot.app.state.drain for slot in self.pool.loaded()]
        await asyncio.gather(*(drain.run() for drain in self._drains))

    def hurry(self) -> None:
        for drain in self._drains:
            drain.hurry()

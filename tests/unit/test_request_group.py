"""A request group ended (the server draining) while its adds are still in flight aborts the
requests that land afterwards: none runs on with nobody reading it."""

from __future__ import annotations

import asyncio

import pytest

from inferd.server.generation.serving import RequestGroup


class SlowClient:
    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.aborted: list[str] = []

    async def add_request(self, request_id, prompt, params, outputs, arrival_time=None):
        await self.release.wait()

    def abort(self, request_id):
        self.aborted.append(request_id)


def test_adds_that_land_after_the_group_ended_are_aborted():
    async def body():
        client = SlowClient()
        group = RequestGroup(client)
        submit = asyncio.ensure_future(group.submit("r", [[1, 2], [3]], None, 0.0))
        await asyncio.sleep(0)
        group.fail(RuntimeError("shutting down"))
        client.release.set()
        await submit
        with pytest.raises(RuntimeError, match="shutting down"):
            async for _ in group.outputs():
                pass
        return client.aborted

    assert sorted(asyncio.run(body())) == ["r-0", "r-1"]

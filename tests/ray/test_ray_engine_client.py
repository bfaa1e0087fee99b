"""RayEngineClient over a scripted deployment handle (no cluster): the replica's verdict comes
first, outputs stream into the request's queue with their prompt filled back in, a replica that
dies before taking a request is skipped, one that dies while running it fails only that request
(naming the replica), and an abort cancels the handle call."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("ray")

from ray.exceptions import ActorDiedError  # noqa: E402

from inferd.engine_client import EngineStats, ModelInfo  # noqa: E402
from inferd.errors import EngineDeadError, InvalidRequest, RequestFailed  # noqa: E402
from inferd.outputs import CompletionOutput, RequestMetrics, RequestOutput  # noqa: E402
from inferd.ray_serve.client import RayEngineClient  # noqa: E402
from inferd.ray_serve.replica_board import ReplicaBoard  # noqa: E402
from inferd.ray_serve.wire import (  # noqa: E402
    Accepted,
    ErrorData,
    Failed,
    PromptMemo,
    Refused,
    ReplicaDescription,
    ReplicaReport,
)
from inferd.sampling_params import SamplingParams  # noqa: E402

STATS = EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0, 0)


class FakeStream:
    """A streaming handle call: yields its items, raising any exception among them."""

    def __init__(self, items: list, hold: bool = False):
        self.items, self.hold, self.cancelled = list(items), hold, False
        self.call = None

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.items:
            if self.hold:
                await asyncio.Event().wait()  # a long request: only a cancel ends it
            raise StopAsyncIteration
        item = self.items.pop(0)
        await asyncio.sleep(0)
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self):
        self.cancelled = True


class FakeHandle:
    def __init__(self, streams: list[FakeStream]):
        self.streams = streams
        self.calls = []

    def options(self, **kwargs):
        assert kwargs == {"method_name": "generate", "stream": True}
        return self

    def remote(self, call):
        self.calls.append(call)
        stream = self.streams.pop(0)
        stream.call = call
        return stream


def _outputs(replica_clock: float, n: int) -> list[RequestOutput]:
    memo, out = PromptMemo(), []
    for i in range(1, n + 1):
        m = RequestMetrics(arrival_time=0.0, first_token_time=replica_clock + 0.5)
        item = RequestOutput("r-0", "hi", [2, 5], [CompletionOutput(0, "a" * i, [7] * i)],
                             finished=i == n, metrics=m)  # fmt: skip
        out.append(memo.thin(item))
    return out


def _client(streams: list[FakeStream]) -> tuple[RayEngineClient, FakeHandle, ReplicaBoard]:
    info = ModelInfo("m", "M", 64, 100, "fp")
    description = ReplicaDescription(info, object(), None, "rep-a", "node-1", STATS)
    board = ReplicaBoard("m")
    board.report(ReplicaReport("rep-a", "node-1", None, STATS))
    handle = FakeHandle(streams)
    return RayEngineClient(handle, description, board), handle, board


async def _drain(queue: asyncio.Queue) -> list:
    items = []
    while True:
        item = await asyncio.wait_for(queue.get(), 5)
        items.append(item)
        if isinstance(item, BaseException) or item.finished:
            return items


PROMPT = {"prompt": "hi", "prompt_token_ids": [2, 5]}


def test_outputs_stream_with_their_prompt_and_the_ingress_clock():
    async def main():
        accepted = Accepted("rep-a", "node-1", clock=-1000.0)  # a very different clock
        client, handle, _ = _client([FakeStream([accepted, *_outputs(-1000.0, 3)])])
        client.start()
        queue: asyncio.Queue = asyncio.Queue()
        seen = []
        client.observe_outputs(seen.append)
        arrival = time.monotonic()
        await client.add_request("r-0", PROMPT, SamplingParams(max_tokens=3), queue, arrival)
        items = await _drain(queue)
        assert [len(o.outputs[0].token_ids) for o in items] == [1, 2, 3] and seen == items
        assert all(o.prompt_token_ids == [2, 5] for o in items)
        m = items[-1].metrics
        # The replica stamped its first token 0.5 s after it took the request, on its clock.
        assert m.arrival_time == arrival and 0.5 <= m.time_to_first_token < 1.5
        assert 0 <= handle.calls[0].waited_s < 1.0

    asyncio.run(main())


def test_a_refused_request_raises_its_typed_error_before_anything_streams():
    async def main():
        refused = Refused(ErrorData.of(InvalidRequest("response_format", "bad schema")))
        client, _, _ = _client([FakeStream([refused])])
        client.start()
        with pytest.raises(InvalidRequest) as e:
            await client.add_request("r-0", PROMPT, SamplingParams(), asyncio.Queue())
        assert e.value.param == "response_format"

    asyncio.run(main())


def test_a_replica_gone_before_it_took_the_request_is_skipped():
    async def main():
        dead = FakeStream([ActorDiedError()])
        engine_dead = FakeStream([Refused(ErrorData.of(EngineDeadError("loop died")))])
        good = FakeStream([Accepted("rep-b", "node-2", 0.0), *_outputs(0.0, 1)])
        client, handle, _ = _client([dead, engine_dead, good])
        client.start()
        queue: asyncio.Queue = asyncio.Queue()
        await client.add_request("r-0", PROMPT, SamplingParams(), queue)
        assert len(handle.calls) == 3 and (await _drain(queue))[-1].finished
        client2, _, _ = _client([FakeStream([ActorDiedError()]) for _ in range(3)])
        client2.start()
        with pytest.raises(EngineDeadError, match="no engine replica could take the request"):
            await client2.add_request("r-1", PROMPT, SamplingParams(), asyncio.Queue())

    asyncio.run(main())


def test_a_replica_dying_mid_request_fails_that_request_naming_it():
    async def main():
        items = [Accepted("rep-a", "node-1", 0.0), *_outputs(0.0, 3)[:2], ActorDiedError()]
        client, _, board = _client([FakeStream(items)])
        client.start()
        queue: asyncio.Queue = asyncio.Queue()
        await client.add_request("r-0", PROMPT, SamplingParams(), queue)
        got = await _drain(queue)
        assert len(got) == 3 and isinstance(got[-1], RequestFailed)
        assert "engine replica rep-a" in str(got[-1]) and "died" in str(got[-1])
        assert "no engine replica is serving" in board.health()  # it left the board

    asyncio.run(main())


def test_an_engine_failure_after_the_start_arrives_typed():
    async def main():
        items = [Accepted("rep-a", "node-1", 0.0), Failed(ErrorData.of(RequestFailed("boom")))]
        client, _, _ = _client([FakeStream(items)])
        client.start()
        queue: asyncio.Queue = asyncio.Queue()
        await client.add_request("r-0", PROMPT, SamplingParams(), queue)
        [error] = await _drain(queue)
        assert isinstance(error, RequestFailed) and str(error) == "boom"

    asyncio.run(main())


def test_abort_cancels_the_handle_call_and_stop_fails_what_runs():
    async def main():
        first = _outputs(0.0, 5)[:1]
        running = FakeStream([Accepted("rep-a", "node-1", 0.0), *first], hold=True)
        other = FakeStream([Accepted("rep-a", "node-1", 0.0), *first], hold=True)
        client, _, _ = _client([running, other])
        client.start()
        queue, queue2 = asyncio.Queue(), asyncio.Queue()
        await client.add_request("r-0", PROMPT, SamplingParams(), queue)
        await client.add_request("r-1", PROMPT, SamplingParams(), queue2)
        assert len((await queue.get()).outputs[0].token_ids) == 1
        client.abort("r-0")
        await asyncio.sleep(0.05)
        assert running.cancelled and queue.empty()
        client.stop()
        await asyncio.sleep(0.05)
        assert other.cancelled
        items = [queue2.get_nowait() for _ in range(queue2.qsize())]
        assert isinstance(items[-1], EngineDeadError)
        assert client.health() == "the server is stopping"

    asyncio.run(main())

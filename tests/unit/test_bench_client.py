"""The `bench serve` client: server-sent events read in chunks of any size (bench/sse_events.py),
and `run_serve` against a small local server whose stream arrives in awkward pieces."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from inferd.bench.sse_events import SSEDataSplitter
from inferd.bench.workload import BenchRequest

STREAM = (
    b": a comment\n"
    b"event: delta\n"
    b'data: {"a": 1}\n'
    b"\n"
    b"data: first line\n"
    b"data:second line\n"
    b"id: 7\n"
    b"\n"
    b"data: [DONE]\n"
    b"\n"
)
EXPECTED = [b'{"a": 1}', b"first line\nsecond line", b"[DONE]"]


def _fed(pieces: list[bytes]) -> list[bytes]:
    splitter = SSEDataSplitter()
    return [data for piece in pieces for data in splitter.feed(piece)]


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"])
def test_events_split_at_every_byte_are_the_same_events(line_end):
    stream = STREAM.replace(b"\n", line_end)
    assert _fed([stream]) == EXPECTED
    for cut in range(1, len(stream)):
        assert _fed([stream[:cut], stream[cut:]]) == EXPECTED, cut
    assert _fed([stream[i : i + 1] for i in range(len(stream))]) == EXPECTED


def test_an_event_is_complete_only_at_its_blank_line():
    splitter = SSEDataSplitter()
    assert splitter.feed(b"data: x\n") == []
    assert splitter.feed(b"\ndata: y") == [b"x"]
    assert splitter.feed(b"\n\n") == [b"y"]
    assert splitter.feed(b"\n\n") == []  # blank lines alone end no event


def _event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _text(text: str, finish: str | None = None) -> bytes:
    return _event({"choices": [{"index": 0, "text": text, "finish_reason": finish}]})


class _Server:
    """An aiohttp server on its own thread: /v1/models, and /v1/completions answering with
    `body`'s pieces, each written and flushed on its own after a short pause (so they reach
    the client as separate reads), or with `status` when it is not 200."""

    def __init__(self, pieces: list[bytes], status: int = 200):
        self.pieces, self.status = pieces, status
        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    def _serve(self) -> None:
        from aiohttp import web

        async def models(request):
            return web.json_response({"data": [{"id": "m"}]})

        async def completions(request):
            await request.json()
            if self.status != 200:
                return web.Response(status=self.status, text="nope")
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for piece in self.pieces:
                await resp.write(piece)
                await asyncio.sleep(0.005)
            await resp.write_eof()
            return resp

        async def start():
            app = web.Application()
            app.router.add_get("/v1/models", models)
            app.router.add_post("/v1/completions", completions)
            self.runner = web.AppRunner(app)
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            self.port = self.runner.addresses[0][1]
            self.ready.set()

        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(start())
        self.loop.run_forever()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _serve_once(pieces: list[bytes], status: int = 200, output_len: int = 3):
    pytest.importorskip("aiohttp")
    from inferd.bench.serve import run_serve

    server = _Server(pieces, status)
    try:
        url = f"http://127.0.0.1:{server.port}"
        return run_serve(url, [BenchRequest([1, 2, 3], output_len)]).timings
    finally:
        server.close()


def test_a_stream_in_awkward_pieces_is_timed_per_text_event():
    stream = (
        _text("a")
        + _text("")  # no text: not a token's arrival
        + _text("b")
        + _text("c", "length")
        + _event({"choices": [], "usage": {"completion_tokens": 3}})
        + b"data: [DONE]\n\n"
        + _text("after the end: never read")
    )
    pieces = [stream[:9], stream[9:70], stream[70:71], stream[71:]]
    (timing,) = _serve_once(pieces)
    assert timing.error is None
    assert timing.output_tokens == 3  # from the usage chunk
    assert len(timing.chunk_times) == 3  # a, b, c: the empty-text event is not one
    assert timing.first_token == timing.chunk_times[0] <= timing.end == timing.chunk_times[-1]


def test_no_usage_chunk_counts_a_length_finish_as_every_asked_token():
    (timing,) = _serve_once([_text("a"), _text("b", "length"), b"data: [DONE]\n\n"], output_len=5)
    assert timing.output_tokens == 5 and len(timing.chunk_times) == 2


def test_an_http_error_fails_the_probe_with_the_servers_answer():
    with pytest.raises(ValueError, match="HTTP 503: nope"):
        _serve_once([], status=503)

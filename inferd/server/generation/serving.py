"""What every generation route shares: submit the engine requests behind one HTTP request, read
their outputs, and abort them the moment the client goes away.

One HTTP request may carry several prompts (completions) and each prompt n samples; each prompt
is one engine request, and all of them feed one asyncio queue owned by a `RequestGroup`. The
group also carries the request's admission (server/http/admission.py): its place in the queue is
given up as each engine request produces its first output, and entirely when the group ends.

A client that goes away costs nothing from the moment it is gone: `abandon_when_gone` watches
the connection while a route works towards its answer (tokenizing, compiling a grammar, waiting
for the engine to take or finish its requests) and cancels the route when the client leaves,
which aborts its engine requests (`RequestGroup.submit`, `collect`) before the next step.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from fastapi import Request, Response

from inferd.engine_client import EngineClient
from inferd.errors import QUEUE_TIMEOUT, QueueTimeout, RequestFailed
from inferd.outputs import RequestOutput

if TYPE_CHECKING:
    from inferd.server.http.admission import Reservation

_CLOSED = object()  # wakes a reader blocked on the queue after an abort
CLIENT_GONE = 499  # nginx's code for "client closed request": nobody reads it, logs do
# An ASGI scope key that only an in-process caller can set (no HTTP client can): true, the
# request's engine requests run in the background lane (engine/scheduling/background_lane.py).
# A batch's lines set it (server/batches/in_process.py).
BACKGROUND = "inferd.background"


class RequestGroup:
    """The engine requests serving one HTTP request, and their shared output queue."""

    def __init__(
        self,
        client: EngineClient,
        reservation: Reservation | None = None,
        tokenize: Callable[..., Awaitable[Any]] | None = None,
        param: str = "prompt",
        background: bool = False,  # its engine requests run in the background lane
    ):
        self.client = client
        self.background = background
        self.queue: asyncio.Queue = asyncio.Queue()
        self.request_ids: list[str] = []
        self._open: set[str] = set()
        self.closed = False
        self.finishing: asyncio.Task | None = None  # `finish_prompts`: aborts wait for it
        self.failure: BaseException | None = None  # why the server ended it (fail)
        self.reservation = reservation
        self.param = param
        # Runs tokenizer work off the event loop (ServerState.tokenize, sized for this request).
        self.tokenize = tokenize or (lambda function, *args: asyncio.to_thread(function, *args))
        if reservation is not None:
            reservation.group = self

    async def submit(self, base_id: str, prompts: list[Any], params: Any, arrival: float) -> None:
        """Queue one engine request per prompt, all or none: they are sent together (so the loop
        thread takes them in one batch) and the first failure aborts the others. The exact
        prompt lengths are checked against the queue first (Overloaded, InvalidRequest)."""
        if self.failure is not None:
            raise self.failure
        ids = [f"{base_id}-{i}" for i in range(len(prompts))]
        if self.reservation is not None:
            counts = [len(p["prompt_token_ids"]) if isinstance(p, dict) else 1 for p in prompts]
            self.reservation.tokenized(counts, self.param)
            self.reservation.bind(ids)
        if self.background:
            prompts = [{**p, "background": True} if isinstance(p, dict) else p for p in prompts]
        pairs = zip(ids, prompts, strict=True)
        adds = [self.client.add_request(rid, p, params, self.queue, arrival) for rid, p in pairs]
        try:
            results = await asyncio.gather(*adds, return_exceptions=True)
        except asyncio.CancelledError:
            for rid in ids:
                self.client.abort(rid)
            raise
        for rid, result in zip(ids, results, strict=True):
            if result is None:
                self.request_ids.append(rid)
                if self.closed:  # ended (a drain's fail) while the adds were in flight
                    self.client.abort(rid)
                else:
                    self._open.add(rid)
        error = next((r for r in results if isinstance(r, BaseException)), None)
        if error is not None:
            self.abort()
            raise error  # typed (InvalidRequest, Overloaded, ...): the app's handlers answer

    async def outputs(self) -> AsyncIterator[RequestOutput]:
        """Every output of every request until all have finished: per step with news (a
        stream's hold only the news: RequestOutputKind.DELTA), or cumulative ones."""
        while self._open and not self.closed:
            item = await self.queue.get()
            if item is _CLOSED:
                break
            if isinstance(item, BaseException):
                self.abort()
                raise item
            self._note(item)
            if item.finished:
                self._open.discard(item.request_id)
            if item.error:
                self.abort()
                if any(c.finish_reason == QUEUE_TIMEOUT for c in item.outputs):
                    raise QueueTimeout(item.error)  # 503 with Retry-After: it never ran
                raise RequestFailed(item.error)
            yield item
        if self.failure is not None:
            raise self.failure

    def _note(self, out: RequestOutput) -> None:
        """Admission bookkeeping: the first output takes a request out of the queue."""
        if self.reservation is None:
            return
        self.reservation.started(out.request_id)  # a no-op after the first output
        if out.finished:
            self.reservation.finished(out.request_id)

    def finish_prompts(self) -> None:
        """The route has answered, but the prompts go on until their first token (they are then
        in the prefix cache, which is what a warm-up request is for); then the group is aborted.
        Meanwhile `abort()` waits for this; the route's own reader must be done with
        `outputs()` (a fresh one reads on)."""

        async def first_tokens() -> None:
            try:
                async for out in self.outputs():
                    if all(c.token_ids for c in out.outputs) or out.finished:
                        break
            finally:
                self.finishing = None
                self.abort()

        self.finishing = asyncio.ensure_future(first_tokens())

    def abort(self) -> None:
        """Abort what is still running (frees its KV blocks before the next step)."""
        if self.reservation is not None:
            self.reservation.release()
        if self.closed or self.finishing is not None:
            return
        self.closed = True
        for rid in self._open:
            self.client.abort(rid)
        self._open.clear()
        self.queue.put_nowait(_CLOSED)

    def fail(self, error: BaseException) -> None:
        """End the group with `error` (the server is shutting down): its engine requests are
        aborted and its reader raises `error` (a stream sends it as an event, then [DONE])."""
        if self.failure is None:
            self.failure = error
        if self.finishing is not None:  # a prompt left to finish: not while the server ends
            self.finishing.cancel()
            self.finishing = None
        self.abort()


async def wait_for_disconnect(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read already, so the
    next ASGI message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def collect(group: RequestGroup) -> dict[str, RequestOutput]:
    """The final output of each request. NOTE: the route is `abandon_when_gone`: a client that
    leaves cancels this wait, and the group's requests are aborted on the way out."""
    final: dict[str, RequestOutput] = {}
    try:
        async for out in group.outputs():
            if out.finished:
                final[out.request_id] = out
        return final
    finally:
        group.abort()


async def abort_on_disconnect(group: RequestGroup, request: Request) -> None:
    """For streams: Starlette cancels the body generator on disconnect, but only once it next
    awaits; aborting from here frees the blocks even while the request is still queued."""
    await wait_for_disconnect(request)
    group.abort()


def abandon_when_gone(route: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """A generation route, cancelled the moment its client disconnects before the route has
    its answer (a plain reply, or a stream's first byte): the cancellation aborts whatever the
    route submitted, even requests still queued in the engine or not yet added, so abandoned
    requests never hold the queue. The route must take `request: Request` by keyword, as
    FastAPI calls it. Streams are watched further by `abort_on_disconnect`."""

    @functools.wraps(route)
    async def guarded(*args: Any, **kwargs: Any) -> Any:
        work = asyncio.ensure_future(route(*args, **kwargs))
        gone = asyncio.ensure_future(wait_for_disconnect(kwargs["request"]))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            if work.done():
                return work.result()  # its errors reach the app's handlers
            work.cancel()
            await asyncio.wait({work})  # its cleanup (the aborts) runs before the reply
            return Response(status_code=CLIENT_GONE)
        finally:
            gone.cancel()
            work.cancel()

    return guarded


def arrival_now() -> float:
    return time.monotonic()

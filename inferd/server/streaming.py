"""The SSE body of a streamed completion or chat completion, and the life every stream shares.

`guarded` owns what any API's stream needs: the disconnect watch (abort, so the KV blocks are
freed before the next step), errors after the headers went out (the API's error events), and
the abort when the stream ends however it ends. `stream_events` is the OpenAI chunk stream on
top of it: the route supplies how to turn one engine output into chunk choices; the usage
chunk, the error event then `[DONE]`, and the final `[DONE]` are here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from inferd.outputs import RequestOutput
from inferd.server.errors import APIError, app_errors, error_status, internal_error
from inferd.server.responses import usage_of
from inferd.server.serving import RequestGroup, abort_on_disconnect
from inferd.server.sse import DONE, encode_event, error_event

ChunkChoices = Callable[[int, RequestOutput], list[dict[str, Any]]]


def stream_failure(error: BaseException, request: Any = None) -> APIError:
    """What a failure after the stream started is (RequestFailed, EngineDeadError, the server
    shutting down, or a bug, logged under the id the answer carries)."""
    errors = app_errors(request.scope) if hasattr(request, "scope") else None
    return error_status(error) or internal_error(error, "a stream", errors)


async def guarded(
    group: RequestGroup,
    request: Any,
    events: AsyncIterator[bytes],
    on_error: Callable[[APIError], list[bytes]],
) -> AsyncIterator[bytes]:
    """`events` as a stream's body: the group is aborted when the client leaves or the stream
    ends, and a failure becomes the API's own closing events (`on_error`)."""
    watcher = asyncio.ensure_future(abort_on_disconnect(group, request))
    try:
        async for event in events:
            yield event
    except Exception as e:  # noqa: BLE001 - the status line is sent: report in the stream
        for event in on_error(stream_failure(e, request)):
            yield event
    finally:
        watcher.cancel()
        group.abort()


async def stream_events(
    group: RequestGroup,
    request: Any,
    head: dict[str, Any],
    chunk_choices: ChunkChoices,
    include_usage: bool,
    opening: list[dict[str, Any]] | None = None,
    continuous_usage: bool = False,
    opening_fields: dict[str, Any] | None = None,
    trailer: Callable[[list[RequestOutput]], dict[str, Any]] | None = None,
) -> AsyncIterator[bytes]:
    """`head` holds the fields every chunk repeats (id, object, created, model, fingerprint);
    `opening` are choices sent before any token (the chat role chunk), with `opening_fields`
    added to that chunk only. `continuous_usage` (vLLM's stream_options.continuous_usage_stats):
    every chunk carries the usage so far. `trailer` gives the fields of a last chunk (no
    choices) from the final outputs, e.g. the requests' timelines."""
    prompt_index = {rid: i for i, rid in enumerate(group.request_ids)}
    latest: dict[str, RequestOutput] = {}

    def so_far() -> dict[str, Any]:
        return usage_of([latest[r] for r in group.request_ids if r in latest])

    async def chunks() -> AsyncIterator[bytes]:
        if opening:
            extra = {"usage": so_far()} if continuous_usage else {}
            yield encode_event({**head, **(opening_fields or {}), "choices": opening, **extra})
        async for out in group.outputs():
            choices = chunk_choices(prompt_index[out.request_id], out)
            latest[out.request_id] = out
            if choices:
                extra = {"usage": so_far()} if continuous_usage else {}
                yield encode_event({**head, "choices": choices, **extra})
        if trailer is not None:  # each request's latest output is its final one by now
            outs = [latest[r] for r in group.request_ids if r in latest]
            yield encode_event({**head, "choices": [], **trailer(outs)})
        if include_usage:
            yield encode_event({**head, "choices": [], "usage": so_far()})
        yield DONE

    def failed(error: APIError) -> list[bytes]:
        return [error_event(error.message, code=error.code), DONE]

    async for event in guarded(group, request, chunks(), failed):
        yield event

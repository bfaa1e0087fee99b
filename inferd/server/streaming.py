"""The SSE body of a streamed completion or chat completion.

The route supplies how to turn one engine output into chunk choices; this module owns the rest
of a stream's life: the disconnect watch (abort, so the KV blocks are freed before the next
step), the usage chunk, errors after the headers went out (an error event, then `[DONE]`), and
the final `[DONE]`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from inferd.outputs import RequestOutput
from inferd.server.errors import app_errors, error_status, internal_error
from inferd.server.responses import usage_of
from inferd.server.serving import RequestGroup, abort_on_disconnect
from inferd.server.sse import DONE, encode_event, error_event

ChunkChoices = Callable[[int, RequestOutput], list[dict[str, Any]]]


def stream_error(error: BaseException, request: Any = None) -> bytes:
    """The error event for a failure after the stream started (RequestFailed, EngineDeadError,
    the server shutting down, or a bug, logged under the id the event carries)."""
    errors = app_errors(request.scope) if hasattr(request, "scope") else None
    known = error_status(error) or internal_error(error, "a stream", errors)
    return error_event(known.message, code=known.code)


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
    watcher = asyncio.ensure_future(abort_on_disconnect(group, request))

    def so_far() -> dict[str, Any]:
        return usage_of([latest[r] for r in group.request_ids if r in latest])

    try:
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
    except Exception as e:  # noqa: BLE001 - the status line is sent: report in the stream
        yield stream_error(e, request)
        yield DONE
    finally:
        watcher.cancel()
        group.abort()

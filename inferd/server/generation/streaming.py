"""The SSE body of a streamed completion or chat completion, and the life every stream shares.

`guarded` owns what any API's stream needs: the disconnect watch (abort, so the KV blocks are
freed before the next step), errors after the headers went out (the API's error events), and
the abort when the stream ends however it ends. `stream_events` is the OpenAI chunk stream on
top of it: the route hands it the engine's outputs paired with their chunk's choices; the usage
(counted from the outputs as they pass), the error event then `[DONE]`, and the final `[DONE]`
are here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from inferd.outputs import RequestOutput
from inferd.server.generation.serving import RequestGroup, abort_on_disconnect
from inferd.server.http.errors import APIError, app_errors, error_status, internal_error
from inferd.server.http.sse import DONE, encode_event, error_event
from inferd.server.openai.shapes import usage


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


class StreamUsage:
    """The usage of a group's requests so far, from their outputs (delta or cumulative)."""

    def __init__(self) -> None:
        self._prompt: dict[str, int] = {}
        self._completion: dict[str, int] = {}
        self._cached: dict[str, int] = {}

    def add(self, out: RequestOutput) -> None:
        rid, tokens = out.request_id, sum(len(c.token_ids) for c in out.outputs)
        self._prompt[rid], self._cached[rid] = len(out.prompt_token_ids), out.num_cached_tokens
        self._completion[rid] = self._completion.get(rid, 0) + tokens if out.delta else tokens

    def json(self) -> dict[str, Any]:
        """Prompt tokens count once per prompt, however many samples (n) it has."""
        return usage(sum(self._prompt.values()), sum(self._completion.values()),
                     sum(self._cached.values()))  # fmt: skip


async def stream_events(
    group: RequestGroup,
    request: Any,
    head: dict[str, Any],
    outputs: AsyncIterator[tuple[RequestOutput, list[dict[str, Any]]]],
    include_usage: bool,
    opening: list[dict[str, Any]] | None = None,
    continuous_usage: bool = False,
    opening_fields: dict[str, Any] | None = None,
    trailer: Callable[[list[RequestOutput]], dict[str, Any]] | None = None,
) -> AsyncIterator[bytes]:
    """`outputs`: the group's outputs, each with the choices of its chunk (none: no chunk).
    `head` holds the fields every chunk repeats (id, object, created, model, fingerprint);
    `opening` are choices sent before any token (the chat role chunk), with `opening_fields`
    added to that chunk only. `continuous_usage` (vLLM's stream_options.continuous_usage_stats):
    every chunk carries the usage so far. `trailer` gives the fields of a last chunk (no
    choices) from the final outputs, e.g. the requests' timelines."""
    latest: dict[str, RequestOutput] = {}
    so_far = StreamUsage()

    async def chunks() -> AsyncIterator[bytes]:
        if opening:
            extra = {"usage": so_far.json()} if continuous_usage else {}
            yield encode_event({**head, **(opening_fields or {}), "choices": opening, **extra})
        async for out, choices in outputs:
            latest[out.request_id] = out
            so_far.add(out)
            if choices:
                extra = {"usage": so_far.json()} if continuous_usage else {}
                yield encode_event({**head, "choices": choices, **extra})
        if trailer is not None:  # each request's latest output is its final one by now
            outs = [latest[r] for r in group.request_ids if r in latest]
            yield encode_event({**head, "choices": [], **trailer(outs)})
        if include_usage:
            yield encode_event({**head, "choices": [], "usage": so_far.json()})
        yield DONE

    def failed(error: APIError) -> list[bytes]:
        return [error_event(error.message, code=error.code), DONE]

    async for event in guarded(group, request, chunks(), failed):
        yield event

"""Server-sent events as the OpenAI streaming API frames them: one `data: <json>` event per chunk,
then `data: [DONE]`. An error after the stream started can no longer change the HTTP status, so
it travels as an event holding `{"error": {...}}`, still followed by `[DONE]` so that clients
waiting for the terminator stop reading. The Responses and Anthropic streams name each event on
an `event:` line and end without `[DONE]`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
from fastapi.responses import StreamingResponse

DONE = b"data: [DONE]\n\n"
HEADERS = {
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # reverse proxies must not hold tokens back
}


# NOTE: msgspec, not json.dumps: an event per token, encoded right after a forward pass has
# evicted the caches, where the json module's Python-level encoder path costs several times
# msgspec's. Its output is compact UTF-8 JSON, as OpenAI's; non-finite floats would become
# null (none reach here: logprobs are floored, responses.py).
_ENCODER = msgspec.json.Encoder()


def encode_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + _ENCODER.encode(payload) + b"\n\n"


def encode_named_event(name: str, payload: dict[str, Any]) -> bytes:
    """An event with its type on an `event:` line (the Responses and Anthropic streams: their
    clients dispatch on it)."""
    return b"event: " + name.encode("ascii") + b"\n" + encode_event(payload)


def error_event(message: str, type_: str = "server_error", code: str | None = None) -> bytes:
    return encode_event({"error": {"message": message, "type": type_, "param": None, "code": code}})


def sse_response(events: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers=HEADERS)

"""Replies in the Ollama API's shapes: `created_at`, the timing fields (nanoseconds), the chat
message (`content`, `thinking`, `tool_calls` whose arguments are objects), NDJSON lines.

    total_duration        arrival → the reply's end
    load_duration         0: the model was loaded when the server started
    prompt_eval_count     the prompt's tokens (cached ones included, as Ollama counts them)
    prompt_eval_duration  first scheduled → first token (the prefill)
    eval_count            the reply's tokens
    eval_duration         first token → last token
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import msgspec
from fastapi.responses import StreamingResponse

from inferd.outputs import RequestOutput
from inferd.server.anthropic.output import tool_input
from inferd.server.http.sse import HEADERS
from inferd.tools import ToolCall

# NOTE: msgspec, as the SSE streams: a line per token (server/http/sse.py says why).
_ENCODER = msgspec.json.Encoder()


def ndjson(payload: dict[str, Any]) -> bytes:
    return _ENCODER.encode(payload) + b"\n"


def ndjson_response(lines: Any) -> StreamingResponse:
    return StreamingResponse(lines, media_type="application/x-ndjson", headers=HEADERS)


def created_at() -> str:
    """Now, as Ollama writes it (RFC 3339, UTC)."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _ns(start: float | None, end: float | None) -> int:
    return 0 if start is None or end is None else max(0, round((end - start) * 1e9))


def timings(out: RequestOutput, arrival: float, generated: int) -> dict[str, Any]:
    """The final line's counts and durations (`out`: the request's last output)."""
    m = out.metrics
    first_scheduled = m.first_scheduled_time if m else None
    first_token = m.first_token_time if m else None
    return {
        "total_duration": _ns(arrival, time.monotonic()),
        "load_duration": 0,
        "prompt_eval_count": len(out.prompt_token_ids),
        "prompt_eval_duration": _ns(first_scheduled, first_token),
        "eval_count": generated,
        "eval_duration": _ns(first_token, m.last_token_time if m else None),
    }


def tool_call_json(name: str, arguments: str) -> dict[str, Any]:
    return {"function": {"name": name, "arguments": tool_input(arguments)}}


def message_json(content: str, reasoning: str = "", calls: list[ToolCall] = ()) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["thinking"] = reasoning
    if calls:
        message["tool_calls"] = [tool_call_json(c.name, c.arguments) for c in calls]
    return message


def done_reason(finish_reason: str | None) -> str:
    """Ollama's reasons are the engine's ("stop", "length"); a tool call ends with "stop"."""
    return finish_reason or "stop"

"""The lines of a batch's input file: each one request,

    {"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}

checked here only for what belongs to the batch (the envelope); the body is the route's to
check, as if a client had sent it. A line that fails here fails alone: its error goes to the
batch's error file with its custom_id (null when the line is no JSON object with one), and the
other lines run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

_FIELDS = {"custom_id", "method", "url", "body"}


@dataclass
class Line:
    number: int  # 1-based, in the input file
    custom_id: str | None
    body: bytes | None  # the JSON sent to the route; None when the line is refused
    error: str | None = None  # why the line is refused


def split_lines(content: bytes) -> list[tuple[int, bytes]]:
    """(line number, text) of every non-blank line."""
    return [(i, raw) for i, raw in enumerate(content.split(b"\n"), 1) if raw.strip()]


def parse_line(number: int, raw: bytes, endpoint: str, priority: int | None,
               seen: set[str]) -> Line:  # fmt: skip
    """The request a line makes, or its refusal; `priority`: what every line runs at (the
    server's batch priority, None under fcfs); `seen`: the custom_ids of earlier lines."""
    try:
        line = json.loads(raw)
    except (ValueError, RecursionError) as e:
        return Line(number, None, None, f"line {number} is not valid JSON: {e}")
    if not isinstance(line, dict):
        return Line(number, None, None, f"line {number} must be a JSON object")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return Line(number, None, None, f"line {number}: custom_id must be a non-empty string")

    def refused(message: str) -> Line:
        return Line(number, custom_id, None, f"line {number}: {message}")

    if custom_id in seen:
        return refused(f"custom_id {custom_id!r} is used by an earlier line; each must be unique")
    seen.add(custom_id)
    if unknown := sorted(set(line) - _FIELDS):
        return refused(f"unsupported field(s) {', '.join(unknown)}; a line holds custom_id, "
                       "method, url and body")  # fmt: skip
    if line.get("method") != "POST":
        return refused(f"method must be 'POST', got {line.get('method')!r}")
    if line.get("url") != endpoint:
        return refused(f"url must be the batch's endpoint {endpoint!r}, got {line.get('url')!r}")
    body = line.get("body")
    if not isinstance(body, dict):
        return refused("body must be a JSON object (the request to the endpoint)")
    if body.get("stream"):
        return refused("body.stream: a batch line cannot stream; its answer goes to the output "
                       "file")  # fmt: skip
    if "priority" in body:
        return refused("body.priority: batch lines all run at the batch priority (docs/server.md, "
                       "Batches); a line cannot set its own")  # fmt: skip
    return Line(number, custom_id, json.dumps(_prioritized(body, priority)).encode())


def _prioritized(body: dict[str, Any], priority: int | None) -> dict[str, Any]:
    return body if priority is None else {**body, "priority": priority}

"""One HTTP request sent to the server's own app, in process: how a batch line reaches its
route. The line passes every middleware and the route exactly as a client's request would (the
API key, the body limit, admission, the route's validation), so a batch line is accepted or
refused as the live route would; what comes back is the status and the JSON answer.

The line's engine requests run in the background lane (the scope's BACKGROUND key, which no
HTTP client can set; engine/scheduling/background_lane.py): their prompts are computed only in
the room interactive requests leave, a few tokens a step.

`gone` is the client's disconnect: set, the route sees `http.disconnect` and abandons the line
(server/generation/serving.py aborts its engine requests), which is how a batch is cancelled.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.types import ASGIApp, Message

from inferd.server.generation.serving import BACKGROUND


async def call_app(app: ASGIApp, path: str, body: bytes, headers: list[tuple[bytes, bytes]],
                   gone: asyncio.Event) -> tuple[int, Any]:  # fmt: skip
    """(status, the answer's JSON, or its text when it is not JSON)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *headers,
        ],  # fmt: skip
        "client": ("batch", 0),  # what the access log names as the caller
        "server": ("inferd", 0),
        "state": {},
        BACKGROUND: True,
    }
    sent = False
    status, chunks = 500, []

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    raw = b"".join(chunks)
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", "replace")

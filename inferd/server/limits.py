"""Request-body size limit (HTTP 413), enforced before any route parses the body.

The middleware reads the body itself, refusing at the first byte over the limit (or at once when
Content-Length already says so), then replays it to the app. After the replay it hands `receive`
back to the server, so the routes still see the client's disconnect.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferd.server.errors import APIError


def _too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"the request body exceeds the limit of {limit} bytes (--max-request-bytes)",
        code="request_too_large",
    )


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            return await _too_large(self.max_bytes).response()(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # disconnected while sending the body
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await _too_large(self.max_bytes).response()(scope, receive, send)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

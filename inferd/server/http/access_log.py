"""One access line per HTTP request, when the response is done:

    INFO inferd.access: 127.0.0.1 "POST /v1/chat/completions" 200 0.412 s user='alice'

(`user=` only when the request named its end user: OpenAI's `user` or `safety_identifier`.)

The latency runs from the request's arrival to the last byte of the response, so a streamed
completion counts its whole stream. A plain ASGI middleware (not BaseHTTPMiddleware, which would
hide client disconnects from the routes); `inferd serve --disable-log-requests` leaves it out.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("inferd.access")


class AccessLogMiddleware:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        status = 0  # stays 0 when the app fails before answering (the server then sends 500)

        async def send_and_note(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            client = scope.get("client")
            # The end user the request named (`user`), set by the route (server/state.py).
            user = (scope.get("state") or {}).get("inferd_user")
            log.info(
                '%s "%s %s" %s %.3f s%s',
                client[0] if client else "-",
                scope["method"],
                scope["path"],
                status or 500,
                time.monotonic() - start,
                f" user={user!r}" if user else "",
            )

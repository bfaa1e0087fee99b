"""`HEAD` on every `GET` route (HTTP's rule; probes such as `HEAD /metrics` or `HEAD /health`
use it): the request is served as a GET and only the status line and headers go back, with
the Content-Length the GET's body has. A path with no GET route answers 405, as before.

FastAPI registers a GET route for GET alone; adding HEAD to every route would list each twice
in /openapi.json, so the translation happens here, in front of the router.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HeadAsGetMiddleware:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            return await self.app(scope, receive, send)

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return  # NOTE: the server ends a HEAD response after its headers
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        # NOTE: a copy: the server's own scope keeps "HEAD", so it sends no body either.
        await self.app({**scope, "method": "GET"}, receive, headers_only)

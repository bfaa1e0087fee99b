"""API-key check for every route except the probes (`/health`, `/ping`, `/metrics`), which
monitoring systems call without credentials, the API's description (`/docs`, `/openapi.json`),
the browser pages and their static files (`/`, `/dashboard`, `/dashboard/static/...`: a page
asks for the key, then sends it with every data request), and `OPTIONS` (CORS preflights).
The key comes as `Authorization: Bearer KEY` (OpenAI's clients) or `x-api-key: KEY` (Anthropic's).

A plain ASGI middleware rather than a FastAPI dependency: it also guards unknown paths and runs
before the body is read, so an unauthenticated client cannot make the server buffer a body.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from inferd.server.http.errors import APIError

# Probes, the API's description, the pages (a browser opening them cannot send a bearer header).
OPEN_PATHS = frozenset(
    {"/health", "/ping", "/metrics", "/docs", "/openapi.json", "/", "/dashboard"}
)
OPEN_PREFIXES = ("/dashboard/static/",)  # the pages' scripts and styles (server/dashboard/)


def bearer_token(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None


def api_key_header(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    return next((value.strip() for name, value in headers if name.lower() == b"x-api-key"), None)


def key_matches(given: bytes | None, expected: bytes) -> bool:
    # NOTE: compare_digest takes the same time wherever the first differing byte is, so the
    # key cannot be guessed byte by byte from response times.
    return given is not None and hmac.compare_digest(given, expected)


def _open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.expected = api_key.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # NOTE: OPTIONS carries no credentials (a browser's CORS preflight never does): it is
        # answered by the CORS middleware or the router, never with a 401.
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or _open(scope["path"]):
            return await self.app(scope, receive, send)
        headers = scope.get("headers", [])
        given = [bearer_token(headers), api_key_header(headers)]
        if not any(key_matches(key, self.expected) for key in given):
            error = APIError(
                401,
                "missing or incorrect API key: send 'Authorization: Bearer <key>' or "
                "'x-api-key: <key>'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
            return await error.response(scope)(scope, receive, send)
        return await self.app(scope, receive, send)

"""The browser pages and their data (docs/dashboard.md):

    GET /                          the chat page
    GET /dashboard                 the live view of the engine
    GET /dashboard/static/NAME     their scripts, styles and icon
    GET /dashboard/snapshot        the engine's state now, as JSON          (API key)
    GET /dashboard/events          the same as server-sent events, every    (API key)
                                   `interval` seconds (default 0.5, at least 0.25)

The pages are open, like /docs, since a browser cannot send the key before the page asked for
it; the data needs the key as every other route (server/http/auth.py). The engine client must be a
`SnapshotClient` (inferd/engine_client.py) for the data routes: others answer 501.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response

from inferd.engine_client import EngineClient
from inferd.errors import EngineDeadError, InvalidRequest
from inferd.server.dashboard.sampler import MIN_INTERVAL_S, DashboardSampler
from inferd.server.http.errors import SERVER_ERROR, APIError
from inferd.server.http.sse import encode_event, error_event, sse_response
from inferd.server.state import get_state

router = APIRouter()

MAX_INTERVAL_S = 60.0
PAGES = {"/": "chat.html", "/dashboard": "dashboard.html"}
# NOTE: the pages declare their icon (favicon.svg): without one a browser asks for /favicon.ico
# on every load and logs the failed load (404; 401 behind --api-key) as a console error.
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}  # fmt: skip
# NOTE: every script and style comes from a file of this package; nothing inline, nothing from
# another origin (the pages work offline and a reply's text can never run as script).
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def static_names() -> dict[str, bytes]:
    """The shipped files by name (read once, at start-up: they are a few tens of KiB)."""
    folder = resources.files("inferd.server.dashboard") / "static"
    return {f.name: f.read_bytes() for f in folder.iterdir() if f.name.endswith(tuple(_TYPES))}


def install_dashboard(app: FastAPI, client: EngineClient, request_timeline: bool = False) -> None:
    """Add the pages and their data routes. `request_timeline`: the server honours
    "return_timeline" (the chat page then shows each reply's engine timeline)."""
    app.state.dashboard = DashboardSampler(client, {"request_timeline": request_timeline})
    app.state.dashboard_files = static_names()
    app.include_router(router)


def _file(request: Request, name: str) -> Response:
    body = request.app.state.dashboard_files.get(name)
    if body is None:
        raise APIError(404, f"no such file: {name!r}", code="not_found")
    media = _TYPES[name[name.rindex(".") :]]
    return Response(body, media_type=media, headers=_HEADERS)


@router.get("/", include_in_schema=False)
async def chat_page(request: Request) -> Response:
    return _file(request, PAGES["/"])


@router.get("/dashboard", include_in_schema=False)
async def dashboard_page(request: Request) -> Response:
    return _file(request, PAGES["/dashboard"])


@router.get("/dashboard/static/{name}", include_in_schema=False)
async def static_file(request: Request, name: str) -> Response:
    return _file(request, name)


def _sampler(request: Request) -> DashboardSampler:
    sampler: DashboardSampler = request.app.state.dashboard
    if not sampler.available:
        raise APIError(501, "this engine client cannot describe its state (no snapshot())",
                       SERVER_ERROR, code="not_implemented")  # fmt: skip
    return sampler


@router.get("/dashboard/snapshot")
async def snapshot(request: Request) -> dict[str, Any]:
    """The engine's KV blocks, requests, counters, step phases and memory, and the requests
    that finished lately (inferd/engine_snapshot.py)."""
    return await _sampler(request).payload()


@router.get("/dashboard/events")
async def events(request: Request, interval: float = 0.5) -> Response:
    """A snapshot every `interval` seconds as server-sent events, until the client leaves or
    the server shuts down."""
    if not MIN_INTERVAL_S <= interval <= MAX_INTERVAL_S:
        raise InvalidRequest("interval", f"interval must lie in [{MIN_INTERVAL_S:g}, "
                             f"{MAX_INTERVAL_S:g}] seconds, got {interval:g}")  # fmt: skip
    sampler = _sampler(request)
    admission = get_state(request).admission
    first = await sampler.payload()  # an engine that died answers 503 before the stream starts

    async def stream() -> AsyncIterator[bytes]:
        payload = first
        while True:
            yield encode_event(payload)
            await asyncio.sleep(interval)
            if admission.draining:
                return
            try:
                payload = await sampler.payload()
            except EngineDeadError as e:
                yield error_event(str(e), code="engine_unhealthy")
                return

    return sse_response(stream())

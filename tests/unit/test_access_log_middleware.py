"""The access log: one line per request with method, path, status and latency, also for
requests the app fails on (500) and for other ASGI traffic passed through untouched."""

from __future__ import annotations

import asyncio
import logging
import re

import httpx

from inferd.server.http.access_log import AccessLogMiddleware


async def _app(scope, receive, send):
    if scope["path"] == "/boom":
        raise RuntimeError("boom")
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def _get(path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=AccessLogMiddleware(_app), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        return await c.get(path)


def test_one_line_per_request(caplog):
    with caplog.at_level(logging.INFO, logger="inferd.access"):
        assert asyncio.run(_get("/v1/models?x=1")).status_code == 201
        asyncio.run(_get("/boom"))
    lines = [r.getMessage() for r in caplog.records if r.name == "inferd.access"]
    assert len(lines) == 2
    assert re.fullmatch(r'\S+ "GET /v1/models" 201 \d+\.\d{3} s', lines[0])
    assert re.fullmatch(r'\S+ "GET /boom" 500 \d+\.\d{3} s', lines[1])


def test_lifespan_and_other_scopes_pass_through():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    asyncio.run(AccessLogMiddleware(app)({"type": "lifespan"}, None, None))
    assert seen == ["lifespan"]

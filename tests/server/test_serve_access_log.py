"""`inferd serve` logs one access line per request by default, rejected requests included."""

from __future__ import annotations

import time

import httpx


def test_the_server_logs_each_request_with_its_status(server, http):
    assert http.get("/v1/models").status_code == 200
    assert httpx.get(server.url + "/v1/models", timeout=30).status_code == 401  # no API key
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        log = server.tail(400)
        if '"GET /v1/models" 200' in log and '"GET /v1/models" 401' in log:
            break
        time.sleep(0.2)
    assert '"GET /v1/models" 200' in log and '"GET /v1/models" 401' in log
    assert "inferd.access" in log

"""Fixtures for the reliability tests that run a real `inferd serve`: a server with small limits
(started once per session), and a /health watch around a test (reliability_helpers.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))

from reliability_helpers import LIMITED_FLAGS, HealthWatch  # noqa: E402
from server_helpers import metric, start_server  # noqa: E402


@pytest.fixture(scope="session")
def limited_server():
    server = start_server(*LIMITED_FLAGS)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def limited_http(limited_server):
    with httpx.Client(base_url=limited_server.url, timeout=120) as http:
        yield http


@pytest.fixture
def watch(limited_server, limited_http):
    """/health probed throughout the test; afterwards the server is alive, nothing runs, and
    the KV cache is back to where it was."""
    idle = metric(limited_http, "inferd:kv_cache_usage_perc")
    with HealthWatch(limited_server.url) as w:
        yield w
    w.assert_healthy()
    assert limited_server.proc.poll() is None
    deadline = time.monotonic() + 30
    while metric(limited_http, "inferd:num_requests_running") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metric(limited_http, "inferd:num_requests_running") == 0
    assert metric(limited_http, "inferd:kv_cache_usage_perc") == idle

"""A real `inferd serve` process on loopback with the embedded model, started once per session
(loading takes ~20 s here) and always reaped, even when a test or the start fails."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import API_KEY, MAX_REQUEST_BYTES, start_server


@pytest.fixture(scope="session")
def server():
    """The shared server: API key on, 64 KiB body limit, tool_choice "auto" with the pythonic
    parser (Gemma's call format), otherwise defaults."""
    s = start_server("--max-request-bytes", str(MAX_REQUEST_BYTES), "--enable-auto-tool-choice",
                     "--tool-call-parser", "pythonic", api_key=API_KEY)  # fmt: skip
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def http(server):
    with httpx.Client(base_url=server.url, headers=server.headers(), timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def model_name(http) -> str:
    return http.get("/v1/models").json()["data"][0]["id"]

"""Real `inferd serve` processes on loopback, started once per session (loading takes ~20 s
here) and always reaped, even when a test or the start fails: the embedded model, and the
pulled chat model where it is in the cache."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import API_KEY, MAX_REQUEST_BYTES, ServerProcess, start_server

from inferd.loader import catalog


@pytest.fixture(scope="session")
def server():
    """The shared server: API key on, 64 KiB body limit, tool_choice "auto" with the pythonic
    parser (Gemma's call format), embeddings that may be cut to 64 or 128 values (the
    embeddings tests' `dimensions`), a context of 7264 tokens (what 256 MiB of float32 KV cache
    held when these tests ran in float32: an 8000-token prompt exceeds it), otherwise defaults."""
    s = start_server("--max-request-bytes", str(MAX_REQUEST_BYTES), "--enable-auto-tool-choice",
                     "--tool-call-parser", "pythonic", "--pooler-config",
                     '{"matryoshka_dimensions": [64, 128]}', "--max-model-len", "7264",
                     api_key=API_KEY)  # fmt: skip
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


@pytest.fixture(scope="session")
def chat_server():
    """`inferd serve smollm2-135m-instruct` (its catalog defaults: float32), API key on,
    tool_choice "auto" with the hermes parser (ChatML's call format); skipped when the model
    was not pulled (CI pulls it first: README's test command)."""
    if not catalog.is_present(catalog.SMOLLM2_INSTRUCT):
        pytest.skip("smollm2-135m-instruct is not in the cache (inferd pull smollm2-135m-instruct)")
    s = ServerProcess("smollm2-135m-instruct", "--kv-cache-memory", "64MiB",
                      "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                      api_key=API_KEY)  # fmt: skip
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="session")
def chat_http(chat_server):
    with httpx.Client(base_url=chat_server.url, headers=chat_server.headers(), timeout=120) as c:
        yield c

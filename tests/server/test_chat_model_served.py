"""`inferd serve smollm2-135m-instruct` answers a plain chat question under the model's short
name, greedy, as the offline API does (tests/parity/test_chat_model.py). Runs when the model is
in the cache (the README's test command, which CI runs, pulls it first)."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import ServerProcess

from inferd.loader import catalog

pytestmark = pytest.mark.skipif(
    not catalog.is_present(catalog.SMOLLM2_INSTRUCT),
    reason="smollm2-135m-instruct is not in the cache (inferd pull smollm2-135m-instruct)",
)


def test_served_chat_model_answers_paris_under_its_name():
    server = ServerProcess("smollm2-135m-instruct", "--kv-cache-memory", "64MiB")
    try:
        server.wait_ready()
        question = {"role": "user", "content": "What is the capital of France?"}
        body = {"model": "smollm2-135m-instruct", "temperature": 0, "max_tokens": 24,
                "messages": [question]}  # fmt: skip
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "smollm2-135m-instruct"
        choice = r.json()["choices"][0]
        assert choice["message"]["content"] == "The capital of France is Paris."
        assert choice["finish_reason"] == "stop"
    finally:
        server.stop()

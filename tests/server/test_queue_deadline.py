"""--max-queue-time as clients see it: a request the engine dropped unscheduled (finish reason
"queue_timeout") is a 503 with Retry-After and code `queue_timeout` on every route that runs the
engine, never a 500; the drops are counted in /metrics."""

from __future__ import annotations

import asyncio

import pytest
from fake_client import ScriptedClient
from fastapi.testclient import TestClient

from inferd.engine_client import EngineStats
from inferd.outputs import CompletionOutput, RequestMetrics, RequestOutput
from inferd.server.app import ServerSettings, create_app
from inferd.server.metrics.prometheus import ServerMetrics

DROPPED = ("the request waited 30.0 s in the queue without being scheduled, past the server's "
           "limit of 30 s (--max-queue-time); retry later")  # fmt: skip


class DroppingClient(ScriptedClient):
    """An engine whose every request waited past the deadline: its one output is the end."""

    async def add_request(self, request_id, prompt, params, outputs, arrival_time=None):
        self.requests.append((request_id, dict(prompt), params))
        samples = [CompletionOutput(k, "", [], finish_reason="queue_timeout")
                   for k in range(params.n)]  # fmt: skip
        out = RequestOutput(request_id, None, list(prompt["prompt_token_ids"]), samples, True,
                            None, RequestMetrics(0.0), error=DROPPED)  # fmt: skip
        asyncio.get_running_loop().call_soon(outputs.put_nowait, out)


@pytest.fixture(scope="module")
def http():
    with TestClient(create_app(DroppingClient(), ServerSettings())) as client:
        yield client


@pytest.mark.parametrize("route, body", [
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/responses", {"input": "hi"}),
    ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
])  # fmt: skip
def test_a_request_dropped_from_the_queue_is_a_503_with_retry_after(http, route, body):
    response = http.post(route, json={"model": "fake-model", **body})
    assert response.status_code == 503, response.text
    assert response.headers["Retry-After"] == "1"
    assert "--max-queue-time" in response.text
    if route != "/v1/messages":  # Anthropic's error shape has no code
        assert response.json()["error"]["code"] == "queue_timeout"


def test_a_stream_already_answering_gets_the_error_event(http):
    body = {"model": "fake-model", "prompt": "hi", "stream": True}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200  # the headers went out before the engine dropped it
    assert '"code":"queue_timeout"' in response.text and response.text.endswith("[DONE]\n\n")


def test_metrics_count_the_requests_dropped_past_the_deadline():
    m = ServerMetrics("m")
    text = m.render(EngineStats(0, 3, 0.0, 0, 0, 0, 0, 0, 0, num_queue_timeouts=2)).decode()
    assert 'inferd:request_queue_timeouts_total{engine="0",model_name="m"} 2.0' in text
    assert 'inferd:num_requests_waiting{engine="0",model_name="m"} 3.0' in text

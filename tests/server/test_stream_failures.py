"""A request the engine fails after its stream started ends that stream in the asking API's own
terms, on a scripted engine: the Responses API with an `error` event and `response.failed`,
the Messages API with an Anthropic `error` event (its SDK raises), the chat API with an error
chunk and `[DONE]`."""

from __future__ import annotations

import json

import anthropic
import pytest
from fake_client import ScriptedClient
from starlette.testclient import TestClient

from inferd.errors import RequestFailed
from inferd.server.app import create_app

HI = [{"role": "user", "content": "hi"}]


class FailingClient(ScriptedClient):
    """Streams two tokens of "hello", then fails the request (its step raised)."""

    def _emit(self, request_id, ids, params, samples, outputs, upto) -> None:
        if upto == 3:
            outputs.put_nowait(RequestFailed("RuntimeError: the step broke"))
            return
        super()._emit(request_id, ids, params, samples, outputs, upto)


@pytest.fixture
def http():
    with TestClient(create_app(FailingClient())) as client:
        yield client


def named_events(text: str) -> list[tuple[str, dict]]:
    lines = text.splitlines()
    return [
        (a[7:], json.loads(b[6:]))
        for a, b in zip(lines, lines[1:], strict=False)
        if a.startswith("event: ")
    ]


def test_a_responses_stream_ends_with_error_then_response_failed(http):
    r = http.post("/v1/responses", json={"input": "hi", "stream": True})
    events = named_events(r.text)
    kinds = [k for k, _ in events]
    assert "response.output_text.delta" in kinds and kinds[-2:] == ["error", "response.failed"]
    error, failed = events[-2][1], events[-1][1]
    assert "the step broke" in error["message"] and error["code"] == "engine_error"
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["code"] == "server_error"
    assert [e["sequence_number"] for _, e in events] == list(range(len(events)))


def test_a_messages_stream_ends_with_an_anthropic_error_event(http):
    r = http.post("/v1/messages", json={"max_tokens": 20, "messages": HI, "stream": True})
    kind, error = named_events(r.text)[-1]
    assert kind == "error" and error["type"] == "error"
    assert error["error"]["type"] == "api_error" and "the step broke" in error["error"]["message"]
    sdk = anthropic.Anthropic(
        base_url="http://testserver", api_key="-", http_client=http, max_retries=0
    )
    with pytest.raises(anthropic.APIStatusError, match="the step broke"):
        with sdk.messages.stream(model="fake-model", max_tokens=20, messages=HI) as stream:
            stream.get_final_message()


def test_a_chat_stream_ends_with_an_error_chunk_and_done(http):
    r = http.post("/v1/chat/completions", json={"messages": HI, "stream": True})
    data = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]" and "the step broke" in json.loads(data[-2])["error"]["message"]

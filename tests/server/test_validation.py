"""Bad input against a real server: every case is a 4xx in the OpenAI error shape whose message
names the parameter, never a 500, and the server stays healthy. Also: the API key guards every
route but /health and /metrics, and bodies over --max-request-bytes get 413."""

from __future__ import annotations

import httpx
import openai
import pytest
from server_helpers import MAX_REQUEST_BYTES

pytestmark = pytest.mark.slow

MSG = [{"role": "user", "content": "hi"}]
# (route, body, the parameter the message must name)
CASES = [
    ("/v1/completions", {"prompt": "hi", "temperature": -1}, "temperature"),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, "temperature"),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, "top_p"),
    ("/v1/completions", {"prompt": "hi", "top_k": -5}, "top_k"),
    ("/v1/completions", {"prompt": "hi", "min_p": 2}, "min_p"),
    ("/v1/completions", {"prompt": "hi", "n": 0}, "n"),
    ("/v1/completions", {"prompt": "hi", "n": 100000}, "n"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10**9}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "min_tokens": 9, "max_tokens": 2}, "min_tokens"),
    ("/v1/completions", {"prompt": "hi", "presence_penalty": 3}, "presence_penalty"),
    ("/v1/completions", {"prompt": "hi", "frequency_penalty": -3}, "frequency_penalty"),
    ("/v1/completions", {"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 50}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "stop": [""]}, "stop"),
    ("/v1/completions", {"prompt": "hi", "stop": ["x"] * 40}, "stop"),
    ("/v1/completions", {"prompt": "hi", "stop_token_ids": [-1]}, "stop_token_ids"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"5": 500}}, "logit_bias"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"99999999": 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": "hi", "seed": "abc"}, "seed"),
    ("/v1/completions", {"prompt": ""}, "prompt"),
    ("/v1/completions", {"prompt": []}, "prompt"),
    ("/v1/completions", {"prompt": [[]]}, "prompt"),
    ("/v1/completions", {"prompt": [1, 300000]}, "prompt"),
    ("/v1/completions", {"prompt": 5}, "prompt"),
    ("/v1/completions", {"prompt": "hi " * 8000}, "max_model_len"),
    ("/v1/completions", {}, "prompt"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "x"}]}, "role"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, "role"),
    ("/v1/chat/completions", {"messages": MSG, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": MSG, "logprobs": True, "top_logprobs": 99}, "logprobs"),
    (
        "/v1/chat/completions",
        {"messages": MSG, "max_completion_tokens": -1},
        "max_completion_tokens",
    ),
    ("/generate", {"prompt": "hi", "temperature": -0.5}, "temperature"),
    ("/tokenize", {}, "prompt"),
    ("/detokenize", {"tokens": [1, 10**7]}, "tokens"),
]


@pytest.mark.parametrize("route, body, param", CASES, ids=[f"{r}:{p}" for r, _, p in CASES])
def test_invalid_input_is_400_naming_the_parameter(http, route, body, param):
    r = http.post(route, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert param in error["message"], error


@pytest.mark.parametrize(
    "raw",
    [b'{"prompt": "hi",', b"[1, 2]", b"null", b'"text"', b"\xff\xfe", b"[" * 5000 + b"]" * 5000,
     b'{"prompt": "hi", "temperature": NaN}', b'{"prompt": "hi", "max_tokens": 1e400}',
     b'{"prompt": "hi", "seed": 100000000000000000000000000000, "max_tokens": 1}',
     b'{"prompt": "hi", "top_k": 1000000000000, "max_tokens": 1}',
     b'{"prompt": {"nested": [1, {"a": 2}]}}',
     b'{"messages": [{"role": "user", "content": [{"type": "text"}]}], "max_tokens": 1}'],
)  # fmt: skip
def test_garbage_never_yields_a_500(http, raw):
    for route in ("/v1/completions", "/v1/chat/completions", "/generate"):
        r = http.post(route, content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code < 500, (route, r.text)
        if r.status_code >= 400:
            assert r.json()["error"]["message"]


def test_the_server_is_healthy_after_bad_input(http, model_name):
    assert http.get("/health").status_code == 200
    r = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "model": model_name})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_unknown_model_is_404_through_the_client(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-nonexistent", prompt="hi", max_tokens=1)
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=None, prompt="hi", max_tokens=1, temperature=-2)
    assert "temperature" in e.value.message


GUARDED = [("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
           ("POST", "/generate"), ("POST", "/tokenize"), ("POST", "/detokenize"),
           ("GET", "/version"), ("GET", "/no-such-route")]  # fmt: skip


def test_api_key_guards_every_route_but_health_and_metrics(server):
    with httpx.Client(base_url=server.url, timeout=30) as anonymous:
        for method, path in GUARDED:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
                r = anonymous.request(method, path, headers=headers, json={"prompt": "hi"})
                assert r.status_code == 401, (method, path, headers)
                assert r.json()["error"]["code"] == "invalid_api_key"
        assert anonymous.get("/health").status_code == 200
        assert anonymous.get("/metrics").status_code == 200
        ok = anonymous.get("/version", headers=server.headers())
        assert ok.status_code == 200 and ok.json()["version"]


def test_oversized_body_is_413(http):
    big = {"prompt": "x" * (MAX_REQUEST_BYTES + 1000)}
    r = http.post("/v1/completions", json=big)
    assert r.status_code == 413 and "max-request-bytes" in r.json()["error"]["message"]

    def chunks():  # no Content-Length: the limit must hold while reading
        yield b'{"prompt": "'
        for _ in range(MAX_REQUEST_BYTES // 1024 + 2):
            yield b"y" * 1024
        yield b'"}'

    r = http.post("/v1/completions", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert http.get("/health").status_code == 200

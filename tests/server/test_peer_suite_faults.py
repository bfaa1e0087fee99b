"""What llama.cpp's and vLLM's own server test suites found (issue 27, item 7), one test each, on
a scripted engine (no model). The request-field table (test_request_fields.py) has the rows for
`response_format`'s keys, 64-bit seeds and `continuous_usage_stats` without `include_usage`."""

from __future__ import annotations

import pytest
from fake_client import ScriptedClient
from starlette.testclient import TestClient

from inferd.server.app import ServerSettings, create_app
from inferd.server.http.api_settings import APISettings


def open_http(**settings) -> TestClient:
    return TestClient(create_app(ScriptedClient(), ServerSettings(**settings)))


@pytest.fixture
def http():
    with open_http() as client:
        yield client


def test_fields_vllm_returns_as_null_are_present(http):
    """Clients written against vLLM read these keys whether or not they asked for them."""
    r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
    assert r.json()["choices"][0]["prompt_logprobs"] is None
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert "prompt_logprobs" in r.json() and r.json()["prompt_logprobs"] is None
    r = http.post("/tokenize", json={"prompt": "hi"})
    assert "token_strs" in r.json() and r.json()["token_strs"] is None


def test_an_echoed_prompt_of_special_tokens_is_in_the_text_as_in_the_logprobs(http):
    """vLLM's test_echo_logprob_completion with `[0, 0, 0, 0, 0]`: `text` starts with the
    prompt decoded with its special tokens, and each logprobs token sits at its text_offset."""
    body = {"prompt": [0, 0, 0, 0, 0], "echo": True, "logprobs": 1, "max_tokens": 5}
    choice = http.post("/v1/completions", json=body).json()["choices"][0]
    tokens, offsets = choice["logprobs"]["tokens"], choice["logprobs"]["text_offset"]
    assert choice["text"] == "<0>" * 5 + "hello"
    assert "".join(tokens) == choice["text"]
    assert all(choice["text"][o:].startswith(t) for t, o in zip(tokens, offsets, strict=True))
    assert choice["logprobs"]["token_logprobs"][0] is None


def test_return_tokens_as_token_ids_flag_applies_to_every_request():
    with open_http(api=APISettings(return_tokens_as_token_ids=True)) as http:
        body = {"prompt": "hi", "max_tokens": 2, "logprobs": 0}
        tokens = http.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]["tokens"]
        assert tokens == ["token_id:104", "token_id:101"]
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "logprobs": True}
        content = http.post("/v1/chat/completions", json=chat).json()["choices"][0]["logprobs"]
        assert content["content"][0]["token"] == "token_id:104"


def test_the_serve_flags_become_the_api_settings():
    import argparse

    from inferd.commands.serve_api import add_api_arguments, api_settings

    parser = argparse.ArgumentParser()
    add_api_arguments(parser)
    assert api_settings(parser.parse_args([])) == APISettings()
    args = parser.parse_args(["--return-tokens-as-token-ids", "--max-stored-responses", "0"])
    assert api_settings(args) == APISettings(True, 0)
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-stored-responses", "-1"])

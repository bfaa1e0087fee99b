"""Server conventions users reach for, on a scripted engine (no model): /openapi.json and /docs,
GET /v1/models/{id}, /ping, CORS (a browser's preflight is never a 401), the cached-token count
in usage, and `inferd serve`'s flags for them."""

from __future__ import annotations

import pytest
from fake_client import ScriptedClient
from starlette.testclient import TestClient

from inferd.server.app import ServerSettings, create_app
from inferd.server.http.cors import CORSSettings, parse_list

KEY = "k-123"
ORIGIN = "http://localhost:3000"


def client(**settings) -> TestClient:
    return TestClient(create_app(ScriptedClient(cached_tokens=3), ServerSettings(**settings)))


def test_openapi_and_docs_describe_every_route_without_a_key():
    with client(api_key=KEY) as http:
        spec = http.get("/openapi.json")
        docs = http.get("/docs")
        assert http.post("/v1/completions", json={"prompt": "x"}).status_code == 401
    assert spec.status_code == 200 and docs.status_code == 200
    assert "swagger" in docs.text.lower()
    paths = spec.json()["paths"]
    for route in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/ping"):
        assert route in paths, route
    chat = spec.json()["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"tools", "tool_choice", "response_format", "structured_outputs"} <= set(chat)


def test_models_by_id_and_ping():
    with client(served_model_names=["a", "b/c"], api_key=KEY) as http:
        auth = {"Authorization": f"Bearer {KEY}"}
        model = http.get("/v1/models/b/c", headers=auth)
        missing = http.get("/v1/models/zzz", headers=auth)
        pings = [http.get("/ping"), http.post("/ping")]  # a probe: no key needed
    assert model.status_code == 200 and model.json()["id"] == "b/c"
    assert model.json()["object"] == "model"
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert [p.status_code for p in pings] == [200, 200]


def preflight(http, origin=ORIGIN):
    return http.options(
        "/v1/chat/completions",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )


def test_a_browser_preflight_is_never_a_401():
    cors = CORSSettings(allowed_origins=[ORIGIN])
    with client(api_key=KEY, cors=cors) as http:
        allowed = preflight(http)
        other = preflight(http, "http://evil.example")
        call = http.post("/v1/completions", json={"prompt": "x"}, headers={"Origin": ORIGIN})
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in allowed.headers["access-control-allow-methods"]
    assert other.status_code == 400  # refused by the CORS rules, not by the key check
    # The 401 itself carries the CORS header, so the page can read why it failed.
    assert call.status_code == 401 and call.headers["access-control-allow-origin"] == ORIGIN


def test_no_origin_is_allowed_by_default_and_credentials_are_opt_in():
    with client(api_key=KEY) as http:
        assert preflight(http).status_code == 400
    cors = CORSSettings(
        allowed_origins=[ORIGIN],
        allowed_methods=["POST"],
        allowed_headers=["authorization"],
        allow_credentials=True,
    )
    with client(cors=cors) as http:
        r = preflight(http)
    assert r.headers["access-control-allow-credentials"] == "true"
    assert r.headers["access-control-allow-methods"] == "POST"
    with pytest.raises(ValueError, match="--allow-credentials"):
        create_app(
            ScriptedClient(), ServerSettings(cors=CORSSettings(["*"], allow_credentials=True))
        )


@pytest.mark.parametrize(
    "text, expected",
    [
        ('["http://a", "http://b"]', ["http://a", "http://b"]),
        ("http://a, http://b", ["http://a", "http://b"]),
        ("*", ["*"]),
    ],
)
def test_cors_flags_take_json_or_comma_lists(text, expected):
    assert parse_list(text) == expected


def test_usage_reports_prefix_cache_hits():
    with client() as http:
        r = http.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2})
        chat = http.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
        )
    assert r.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}
    assert chat.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}


def test_serve_flags_parse_into_settings():
    import argparse

    from inferd.commands import serve
    from inferd.commands.serve_features import (
        check_tool_flags,
        cors_settings,
        with_request_limits,
    )
    from inferd.config import EngineConfig

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    args = parser.parse_args(
        [
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            "--allowed-origins",
            '["http://x"]',
            "--allow-credentials",
            "--max-logprobs",
            "5",
            "--max-stop-string-length",
            "9",
        ]
    )
    check_tool_flags(args)
    assert cors_settings(args) == CORSSettings(["http://x"], ["*"], ["*"], True)
    config = with_request_limits(EngineConfig(), args)
    limits = (config.max_logprobs, config.max_stop_string_length, config.max_n)
    assert limits == (5, 9, 128) and config.max_stop_strings == 16
    with pytest.raises(ValueError, match="--tool-call-parser"):
        check_tool_flags(parser.parse_args(["--enable-auto-tool-choice"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["--tool-call-parser", "xml"])


@pytest.mark.parametrize(
    "architecture, template, flag, fmt, bundled",
    [
        ("gemma3", "{{ messages }}", None, "pythonic", "gemma_tools"),  # Gemma: its own format
        ("llama", "<|im_start|>{{ messages }}", None, "hermes", "chatml_tools"),  # ChatML
        ("llama", "[INST]{{ messages }}", None, "hermes", None),  # no bundled template fits
        ("llama", "[INST]{{ messages }}", "pythonic", "pythonic", "gemma_tools"),  # as asked
        ("gemma3", "{% for t in tools %}{% endfor %}", None, "pythonic", None),  # shows tools
    ],
)
def test_serve_picks_the_call_format_and_the_template_that_shows_tools(
    architecture, template, flag, fmt, bundled
):
    import argparse
    from types import SimpleNamespace

    from inferd.commands.serve_features import tool_settings
    from inferd.tools.templates import tool_chat_template

    engine = SimpleNamespace(tokenizer=SimpleNamespace(chat_template=template),
                             model_config=SimpleNamespace(architecture=architecture))  # fmt: skip
    args = argparse.Namespace(tool_call_parser=flag, enable_auto_tool_choice=flag is not None)
    settings = tool_settings(engine, args)
    assert (settings.parser, settings.forced_format) == (flag, fmt)
    if bundled is None:
        assert settings.template is None
    else:
        parser = {"gemma_tools": "pythonic", "chatml_tools": "hermes"}[bundled]
        assert settings.template.source == tool_chat_template(parser)

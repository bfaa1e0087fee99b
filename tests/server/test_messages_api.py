"""Anthropic's `/v1/messages` on a scripted engine (no model), with the official `anthropic`
client as the black-box judge (`messages.create`, `messages.stream`, `count_tokens`, its error
classes): every declared field is honoured or refused, errors have Anthropic's shape, the key
may come as x-api-key, a tool use round trip reaches the template as chat tool calls (issue 27,
item 3). The same client against the real models: test_client_apis_served.py."""

from __future__ import annotations

import json
from contextlib import contextmanager

import anthropic
import pytest
from fake_client import ScriptedClient
from starlette.testclient import TestClient

from inferd.server.anthropic.request import MessagesRequest
from inferd.server.app import ServerSettings, create_app
from inferd.server.openai.tool_calls import ToolSettings

KEY = "k-1"
WEATHER = {
    "name": "get_weather",
    "description": "the weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CALL = '[get_weather(city="Paris")]'
HI = [{"role": "user", "content": "hi"}]


@contextmanager
def served(reply: str = "hello"):
    fake = ScriptedClient(lambda ids, params, k: reply)
    tools = ToolSettings("pythonic", True, "pythonic")
    with TestClient(create_app(fake, ServerSettings(api_key=KEY, tools=tools))) as http:
        sdk = anthropic.Anthropic(
            base_url="http://testserver", api_key=KEY, http_client=http, max_retries=0
        )
        yield sdk, fake, http


def test_create_answers_with_a_text_block_and_usage():
    with served() as (sdk, fake, _):
        m = sdk.messages.create(model="fake-model", max_tokens=20, system="be kind", messages=HI)
    assert [b.text for b in m.content] == ["hello"] and m.stop_reason == "end_turn"
    assert fake.last[1]["prompt"] == "system:be kind|user:hi|gen|"
    assert m.usage.output_tokens == 5
    assert m.usage.input_tokens == len(fake.last[1]["prompt_token_ids"])


def test_the_stream_is_what_the_sdk_helper_consumes():
    with served() as (sdk, _, _):
        with sdk.messages.stream(model="fake-model", max_tokens=20, messages=HI) as stream:
            kinds = [e.type for e in stream]
            final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    assert final.content[0].text == "hello" and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 5


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_use_block_comes_back_with_its_input(stream):
    with served(CALL) as (sdk, _, _):
        kwargs = dict(model="fake-model", max_tokens=100, tools=[WEATHER], messages=HI)
        if stream:
            with sdk.messages.stream(**kwargs) as s:
                m = s.get_final_message()
        else:
            m = sdk.messages.create(**kwargs)
    [block] = m.content
    assert block.type == "tool_use" and block.name == "get_weather"
    assert block.input == {"city": "Paris"} and m.stop_reason == "tool_use"


def test_the_tool_result_goes_back_as_a_tool_message():
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "text", "text": "Thanks"},
            ],
        },
    ]
    with served("It is sunny.") as (sdk, fake, _):
        m = sdk.messages.create(
            model="fake-model", max_tokens=50, tools=[WEATHER], messages=history
        )
        messages = fake.tokenizer.last_call["messages"]
    assert m.content[0].text == "It is sunny."
    assert messages[1] == {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    }
    assert messages[2:] == [
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "user", "content": "Thanks"},
    ]


def test_count_tokens_counts_the_rendered_prompt():
    with served() as (sdk, fake, _):
        counted = sdk.messages.count_tokens(model="fake-model", messages=HI, system="s")
        sdk.messages.create(model="fake-model", max_tokens=5, messages=HI, system="s")
    assert counted.input_tokens == len(fake.last[1]["prompt_token_ids"])


def test_errors_have_anthropics_shape_and_the_key_may_come_as_x_api_key():
    with served() as (sdk, _, http):
        with pytest.raises(anthropic.NotFoundError) as e:
            sdk.messages.create(model="other", max_tokens=5, messages=HI)
        assert e.value.body["error"]["type"] == "not_found_error"
        with pytest.raises(anthropic.BadRequestError) as e:
            sdk.messages.create(model="fake-model", max_tokens=0, messages=HI)
        assert e.value.body["type"] == "error" and "max_tokens" in e.value.body["error"]["message"]
        wrong = anthropic.Anthropic(
            base_url="http://testserver", api_key="no", http_client=http, max_retries=0
        )
        with pytest.raises(anthropic.AuthenticationError):
            wrong.messages.create(model="fake-model", max_tokens=5, messages=HI)
        r = http.post("/v1/messages", json={"max_tokens": 5, "messages": HI})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        # The OpenAI routes take x-api-key too, and keep their own error shape.
        r = http.post("/v1/completions", json={"prompt": "hi"}, headers={"x-api-key": KEY})
        assert r.status_code == 200
        assert "error" in http.post("/v1/completions", json={}).json()


# ---- every declared field: honoured (what reached the engine or came back) or refused --------
def _params(fake):
    return fake.last[2]


ROWS = {  # field → [(value, extra body, check(response json, fake) or the refused param)]
    "model": [("fake-model", {}, lambda r, f: r["model"] == "fake-model")],
    "messages": [
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ],
            {},
            lambda r, f: f.last[1]["prompt"] == "user:a\nb|gen|",
        ),
        (
            [{"role": "user", "content": [{"type": "image", "source": {}}]}],
            {},
            "messages[0].content[0].source",  # base64 sources only (test_image_parts.py)
        ),
        ([{"role": "system", "content": "x"}], {}, "messages[0]"),
    ],
    "system": [
        (
            [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
            {},
            lambda r, f: f.last[1]["prompt"].startswith("system:s|"),
        )
    ],
    "max_tokens": [
        (3, {}, lambda r, f: _params(f).max_tokens == 3 and r["stop_reason"] == "max_tokens"),
        (0, {}, "max_tokens"),
    ],
    "stop_sequences": [(["l"], {}, lambda r, f: _params(f).stop == ["l"])],
    "temperature": [(0.5, {}, lambda r, f: _params(f).temperature == 0.5)],
    "top_p": [(0.5, {}, lambda r, f: _params(f).top_p == 0.5)],
    "top_k": [(5, {}, lambda r, f: _params(f).top_k == 5)],
    "tools": [
        (
            [WEATHER],
            {"tool_choice": {"type": "none"}},
            lambda r, f: "tools" not in f.tokenizer.last_call,
        ),
        ([{"type": "web_search_20250305", "name": "web_search"}], {}, "tools[0].type"),
        ([{**WEATHER, "input_schema": {"type": "array"}}], {}, "tools[0].input_schema"),
    ],
    "tool_choice": [
        (
            {"type": "tool", "name": "get_weather"},
            {"tools": [WEATHER]},
            lambda r, f: r["content"][0]["type"] == "tool_use",
        ),
        (
            {"type": "any", "disable_parallel_tool_use": True},
            {"tools": [WEATHER]},
            lambda r, f: len(r["content"]) == 1,
        ),
        ({"type": "auto"}, {}, "tool_choice"),
    ],
    "stream": [(True, {}, lambda r, f: r.startswith("event: message_start"))],
    "metadata": [({"user_id": "u1"}, {}, lambda r, f: True), ({"x": 1}, {}, "metadata.x")],
    "service_tier": [("auto", {}, lambda r, f: True), ("priority", {}, "service_tier")],
}
CASES = [(name, *case) for name, cases in ROWS.items() for case in cases]


def test_every_declared_field_has_a_row():
    assert set(MessagesRequest.model_fields) == set(ROWS)


@pytest.mark.parametrize(
    "field, value, extra, check", CASES, ids=[f"{c[0]}={json.dumps(c[1])[:20]}" for c in CASES]
)
def test_each_field_is_honoured_or_refused(field, value, extra, check):
    two_calls = '[get_weather(city="Paris"), get_weather(city="Rome")]'
    reply = (two_calls if field == "tool_choice" else CALL) if "tools" in extra else "hello"
    with served(reply) as (_, fake, http):
        body = {"max_tokens": 100, "messages": HI, **extra, field: value}
        r = http.post("/v1/messages", json=body, headers={"x-api-key": KEY})
    if isinstance(check, str):
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and check in error["message"], error
        return
    assert r.status_code == 200, r.text
    assert check(r.text if field == "stream" else r.json(), fake), r.text


def test_an_undeclared_field_is_refused_by_name():
    with served() as (_, _, http):
        body = {"max_tokens": 5, "messages": HI, "thinking": {"type": "enabled"}}
        r = http.post("/v1/messages", json=body, headers={"x-api-key": KEY})
    assert r.status_code == 400
    error = {"type": "invalid_request_error", "message": "unsupported parameter: thinking"}
    assert r.json() == {"type": "error", "error": error}


def test_an_empty_tools_list_is_no_tools():
    with served() as (sdk, fake, _):
        r = sdk.messages.create(model="fake-model", max_tokens=16, messages=HI, tools=[])
    assert r.content[0].text == "hello"
    assert "tools" not in fake.tokenizer.last_call

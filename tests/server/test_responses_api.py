"""`/v1/responses` on a scripted engine (no model), with the official `openai` client as the
black-box judge (its `responses.create`, `responses.stream`, `retrieve`, `delete`): every
declared request field is honoured or refused, the stream's typed events are what the SDK's
helper consumes, stored responses continue (issue 27, item 2). The same client against the
real models: test_client_apis_served.py."""

from __future__ import annotations

import json
from contextlib import contextmanager

import openai
import pytest
from fake_client import ScriptedClient
from starlette.testclient import TestClient

from inferd.server.app import ServerSettings, create_app
from inferd.server.http.api_settings import APISettings
from inferd.server.openai.tool_calls import ToolSettings
from inferd.server.responses.request import ResponsesRequest

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "strict": True,
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CALL = '[get_weather(city="Paris")]'


@contextmanager
def served(reply: str = "hello", **api):
    fake = ScriptedClient(lambda ids, params, k: reply)
    tools = ToolSettings("pythonic", True, "pythonic")
    app = create_app(fake, ServerSettings(tools=tools, api=APISettings(**api)))
    with TestClient(app) as http:
        sdk = openai.OpenAI(
            base_url="http://testserver/v1", api_key="-", http_client=http, max_retries=0
        )
        yield sdk, fake, http


def prompt_of(fake) -> str:
    return fake.last[1]["prompt"]


def test_create_answers_with_one_message_and_usage():
    with served() as (sdk, fake, _):
        r = sdk.responses.create(model="fake-model", input="hi", instructions="be kind")
    assert r.status == "completed" and r.output_text == "hello"
    assert prompt_of(fake) == "system:be kind|user:hi|gen|"
    assert r.usage.output_tokens == 5
    assert r.usage.input_tokens == len(fake.last[1]["prompt_token_ids"])
    assert r.instructions == "be kind" and r.store is True


def test_a_stored_response_continues_without_its_instructions_and_can_be_deleted():
    with served() as (sdk, fake, _):
        first = sdk.responses.create(model="fake-model", input="hi", instructions="be kind")
        assert sdk.responses.retrieve(first.id).output_text == "hello"
        second = sdk.responses.create(
            model="fake-model", input="again", previous_response_id=first.id
        )
        assert prompt_of(fake) == "user:hi|assistant:hello|user:again|gen|"
        assert second.previous_response_id == first.id
        sdk.responses.delete(first.id)
        with pytest.raises(openai.NotFoundError):
            sdk.responses.retrieve(first.id)
        with pytest.raises(openai.BadRequestError, match="previous_response_id"):
            sdk.responses.create(model="fake-model", input="x", previous_response_id=first.id)


def test_the_store_keeps_the_most_recently_used():
    with served(max_stored_responses=2) as (sdk, _, _):
        a, b = (sdk.responses.create(model="fake-model", input=t) for t in ("a", "b"))
        sdk.responses.retrieve(a.id)  # a use: b is now the least recently used
        sdk.responses.create(model="fake-model", input="c")
        assert sdk.responses.retrieve(a.id).id == a.id
        with pytest.raises(openai.NotFoundError):
            sdk.responses.retrieve(b.id)


def test_a_server_that_stores_nothing_refuses_store_true():
    with served(max_stored_responses=0) as (sdk, _, _):
        assert sdk.responses.create(model="fake-model", input="a").store is False
        with pytest.raises(openai.BadRequestError, match="max-stored-responses 0"):
            sdk.responses.create(model="fake-model", input="a", store=True)


def test_the_stream_is_what_the_sdk_helper_consumes():
    with served() as (sdk, _, _):
        with sdk.responses.stream(model="fake-model", input="hi") as stream:
            events = list(stream)
            final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "hello"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.output_text == "hello" and final.usage.output_tokens == 5


@pytest.mark.parametrize("stream", [False, True])
def test_a_function_call_comes_back_as_an_output_item(stream):
    with served(CALL) as (sdk, _, _):
        if stream:
            with sdk.responses.stream(model="fake-model", input="w", tools=[WEATHER]) as s:
                events = list(s)
                r = s.get_final_response()
            deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
            assert "".join(deltas) == '{"city": "Paris"}'
        else:
            r = sdk.responses.create(model="fake-model", input="w", tools=[WEATHER])
    [call] = r.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"} and call.call_id.startswith("call_")


def test_a_function_call_output_goes_back_to_the_model_as_a_tool_message():
    items = [
        {"role": "user", "content": "weather in Paris?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]
    with served("It is sunny.") as (sdk, fake, _):
        r = sdk.responses.create(model="fake-model", input=items, tools=[WEATHER])
        messages = fake.tokenizer.last_call["messages"]
    assert r.output_text == "It is sunny."
    assert messages[1]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": {"city": "Paris"},
    }
    assert messages[2] == {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}


# ---- every declared field: honoured (what reached the engine or came back) or refused --------
def _params(fake):
    return fake.last[2]


ROWS = {  # field → [(value, extra body, check(response json, fake) or the refused param)]
    "model": [("fake-model", {}, lambda r, f: r["model"] == "fake-model")],
    "input": [
        (
            [{"role": "developer", "content": [{"type": "input_text", "text": "x"}]}],
            {},
            lambda r, f: prompt_of(f).startswith("system:x|"),
        ),
        (
            [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}],
            {},
            "input",  # read as an image, and "u" is no data: URL (test_image_parts.py)
        ),
        ([{"type": "item_reference", "id": "x"}], {}, "input[0].type"),
    ],
    "instructions": [("sys", {}, lambda r, f: prompt_of(f).startswith("system:sys|"))],
    "reasoning": [  # the fake template does not read reasoning_effort
        ({"effort": "low"}, {}, "reasoning.effort"),
        ({"summary": "detailed"}, {}, "reasoning.summary"),
        ({"summary": "auto"}, {}, lambda r, f: r["reasoning"] == {"summary": "auto"}),
    ],
    "previous_response_id": [("resp_none", {}, "previous_response_id")],
    "max_output_tokens": [
        (
            2,
            {},
            lambda r, f: (
                r["status"] == "incomplete"
                and r["incomplete_details"] == {"reason": "max_output_tokens"}
            ),
        ),
        (0, {}, "max_output_tokens"),
    ],
    "temperature": [(0.5, {}, lambda r, f: _params(f).temperature == 0.5 == r["temperature"])],
    "top_p": [(0.5, {}, lambda r, f: _params(f).top_p == 0.5 == r["top_p"])],
    "top_logprobs": [
        (1, {}, lambda r, f: len(r["output"][0]["content"][0]["logprobs"][0]["top_logprobs"]) == 1)
    ],
    "include": [
        (
            ["message.output_text.logprobs"],
            {},
            lambda r, f: r["output"][0]["content"][0]["logprobs"][0]["token"] == "h",
        ),
        (["web_search_call.results"], {}, "include[0]"),
    ],
    "text": [
        (
            {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            {},
            lambda r, f: _params(f).structured_outputs.json == {"type": "object"},
        ),
        (
            {"format": {"type": "json_object"}},
            {},
            lambda r, f: _params(f).structured_outputs.json_object,
        ),
        (
            {"format": {"type": "json_schema", "schema": {}, "strcit": True}},
            {},
            "text.format.strcit",
        ),
        ({"verbosity": "low"}, {}, "text.verbosity"),
    ],
    "tools": [
        ([WEATHER], {"tool_choice": "none"}, lambda r, f: "tools" not in f.tokenizer.last_call),
        ([{"type": "web_search"}], {}, "tools[0].type"),
        ([{**WEATHER, "name": "bad name"}], {}, "tools[0].name"),
    ],
    "tool_choice": [
        (
            {"type": "function", "name": "get_weather"},
            {"tools": [WEATHER]},
            lambda r, f: r["output"][0]["type"] == "function_call",
        ),
        ({"type": "web_search_preview"}, {"tools": [WEATHER]}, "tool_choice"),
    ],
    "parallel_tool_calls": [(False, {"tools": [WEATHER]}, lambda r, f: len(r["output"]) == 1)],
    "stream": [(True, {}, lambda r, f: r.startswith("event: response.created"))],
    "stream_options": [
        ({"include_obfuscation": False}, {"stream": True}, lambda r, f: True),
        ({"include_obfuscation": True}, {"stream": True}, "stream_options.include_obfuscation"),
    ],
    "store": [(False, {}, lambda r, f: r["store"] is False)],
    "metadata": [({"k": "v"}, {}, lambda r, f: r["metadata"] == {"k": "v"})],
    "user": [("alice", {}, lambda r, f: r["user"] == "alice")],
    "safety_identifier": [("bob", {}, lambda r, f: True)],
    "background": [(False, {}, lambda r, f: r["background"] is False), (True, {}, "background")],
    "truncation": [("disabled", {}, lambda r, f: True), ("auto", {}, "truncation")],
    "service_tier": [("auto", {}, lambda r, f: True), ("flex", {}, "service_tier")],
    "priority": [(3, {}, lambda r, f: f.last[1]["priority"] == 3)],  # the engine judges it
}
CASES = [(name, *case) for name, cases in ROWS.items() for case in cases]


def test_every_declared_field_has_a_row():
    assert set(ResponsesRequest.model_fields) == set(ROWS)


@pytest.mark.parametrize(
    "field, value, extra, check", CASES, ids=[f"{c[0]}={json.dumps(c[1])[:20]}" for c in CASES]
)
def test_each_field_is_honoured_or_refused(field, value, extra, check):
    reply = CALL if "tools" in extra or field == "parallel_tool_calls" else "hello"
    if field == "parallel_tool_calls":
        reply = '[get_weather(city="Paris"), get_weather(city="Rome")]'
    with served(reply) as (_, fake, http):
        r = http.post("/v1/responses", json={"input": "hi", **extra, field: value})
    if isinstance(check, str):
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == check and check in error["message"], error
        return
    assert r.status_code == 200, r.text
    body = r.text if extra.get("stream") or field == "stream" else r.json()
    assert check(body, fake), r.text


def test_an_undeclared_field_is_refused_by_name():
    with served() as (_, _, http):
        r = http.post("/v1/responses", json={"input": "hi", "conversation": "conv_1"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["message"] == "unsupported parameter: conversation"
    assert error["param"] == "conversation"


def test_the_agents_sdk_default_empty_tools_and_include_are_no_tools():
    """The OpenAI Agents SDK sends `tools: []` and `include: []` for an agent without tools."""
    with served() as (sdk, fake, _):
        r = sdk.responses.create(model="fake-model", input="hi", tools=[], include=[])
    assert r.status == "completed" and r.output_text == "hello"
    assert "tools" not in fake.tokenizer.last_call

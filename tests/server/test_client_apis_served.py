"""The Responses and Anthropic Messages APIs end to end, the official `openai` and `anthropic`
clients against `inferd serve` with the embedded base model (Gemma 3 270M) and the pulled chat
model (`smollm2-135m-instruct`, skipped where absent). Greedy replies are the chat route's for
the same conversation: the three APIs share one way to the engine (issue 27, items 2 and 3)."""

from __future__ import annotations

import json

import anthropic
import pytest
from openai import OpenAI
from server_helpers import API_KEY

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"
PARIS = "The capital of France is Paris."
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": SCHEMA,
}
GREEDY = {"temperature": 0}  # the anthropic SDK takes it only as an extra field
CLAUDE_WEATHER = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "input_schema": SCHEMA,
}


def sdks(served) -> tuple[OpenAI, anthropic.Anthropic]:
    return (
        OpenAI(base_url=served.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120),
        anthropic.Anthropic(base_url=served.url, api_key=API_KEY, max_retries=0, timeout=120),
    )


def chat_text(http, messages, max_tokens: int) -> str:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    return http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]


# ---- the embedded base model ------------------------------------------------------------------
def test_the_three_apis_give_the_chat_routes_greedy_reply(server, http, model_name):
    openai_sdk, claude = sdks(server)
    messages = [{"role": "user", "content": "Name a color."}]
    expected = chat_text(http, messages, 8)
    r = openai_sdk.responses.create(
        model=model_name, input=messages, max_output_tokens=8, temperature=0
    )
    assert r.output_text == expected and r.usage.output_tokens <= 8
    m = claude.messages.create(model=model_name, max_tokens=8, extra_body=GREEDY, messages=messages)
    assert "".join(b.text for b in m.content) == expected
    with claude.messages.stream(
        model=model_name, max_tokens=8, extra_body=GREEDY, messages=messages
    ) as stream:
        assert "".join(stream.text_stream) == expected


def test_a_streamed_response_in_a_json_schema_completes(server, model_name):
    openai_sdk, _ = sdks(server)
    text = {"format": {"type": "json_schema", "name": "place", "schema": SCHEMA, "strict": True}}
    with openai_sdk.responses.stream(
        model=model_name,
        input="Name a city in France.",
        text=text,
        max_output_tokens=40,
        temperature=0,
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert set(json.loads(final.output_text)) == {"city"}


def test_a_forced_function_call_and_its_output_round_trip(server, http, model_name):
    openai_sdk, _ = sdks(server)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = openai_sdk.responses.create(
        model=model_name,
        input=ask,
        tools=[WEATHER],
        temperature=0,
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=40,
    )
    [call] = r.output
    assert call.type == "function_call" and set(json.loads(call.arguments)) == {"city"}
    follow = [{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C"}]
    r2 = openai_sdk.responses.create(
        model=model_name,
        input=follow,
        previous_response_id=r.id,
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=6,
        temperature=0,
    )
    assert r2.output[0].type == "message"
    # The stored conversation came first: the question, the call and its output.
    alone = http.post("/tokenize", json={"messages": ask}).json()["count"]
    assert r2.usage.input_tokens > alone + 10


def test_a_claude_tool_use_round_trip(server, model_name):
    _, claude = sdks(server)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    choice = {"type": "tool", "name": "get_weather"}
    with claude.messages.stream(
        model=model_name,
        max_tokens=40,
        extra_body=GREEDY,
        messages=ask,
        tools=[CLAUDE_WEATHER],
        tool_choice=choice,
    ) as stream:
        m = stream.get_final_message()
    [use] = m.content
    assert use.type == "tool_use" and set(use.input) == {"city"} and m.stop_reason == "tool_use"
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24 C"}
    history = ask + [
        {"role": "assistant", "content": [use.model_dump(include={"type", "id", "name", "input"})]},
        {"role": "user", "content": [result]},
    ]
    m2 = claude.messages.create(
        model=model_name,
        max_tokens=6,
        extra_body=GREEDY,
        messages=history,
        tools=[CLAUDE_WEATHER],
        tool_choice={"type": "none"},
    )
    assert (
        m2.content and m2.content[0].type == "text" and m2.stop_reason in ("end_turn", "max_tokens")
    )
    counted = claude.messages.count_tokens(
        model=model_name, messages=history, tools=[CLAUDE_WEATHER], tool_choice={"type": "none"}
    )
    assert counted.input_tokens == m2.usage.input_tokens


# ---- the chat model ---------------------------------------------------------------------------
def test_the_chat_model_answers_through_every_api(chat_server, chat_http):
    openai_sdk, claude = sdks(chat_server)
    ask = [{"role": "user", "content": QUESTION}]
    assert chat_text(chat_http, ask, 24) == PARIS
    r = openai_sdk.responses.create(
        model="smollm2-135m-instruct", input=QUESTION, max_output_tokens=24, temperature=0
    )
    assert r.output_text == PARIS and r.status == "completed"
    with openai_sdk.responses.stream(
        model="smollm2-135m-instruct", input=QUESTION, max_output_tokens=24, temperature=0
    ) as stream:
        assert stream.get_final_response().output_text == PARIS
    m = claude.messages.create(
        model="smollm2-135m-instruct", max_tokens=24, extra_body=GREEDY, messages=ask
    )
    assert m.content[0].text == PARIS and m.stop_reason == "end_turn"
    parts = [{"type": "text", "text": QUESTION}]
    m = claude.messages.create(
        model="smollm2-135m-instruct",
        max_tokens=24,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": parts}],
    )
    assert m.content[0].text == PARIS


def test_the_chat_model_calls_a_tool_in_its_format(chat_server):
    openai_sdk, claude = sdks(chat_server)
    ask = "What is the weather in Paris?"
    r = openai_sdk.responses.create(
        model="smollm2-135m-instruct",
        input=ask,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=40,
        temperature=0,
    )
    assert [o.type for o in r.output] == ["function_call"] and r.output[0].name == "get_weather"
    m = claude.messages.create(
        model="smollm2-135m-instruct",
        max_tokens=40,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": ask}],
        tools=[CLAUDE_WEATHER],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    assert m.stop_reason == "tool_use" and m.content[-1].name == "get_weather"

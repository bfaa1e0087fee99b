"""A harmony model (gpt-oss) behind every chat API, on a scripted engine whose reply is harmony
text: reasoning, content and tool calls come back in each API's own fields, whole and streamed
(read by the official clients), with no marker text anywhere; the conversation sent back
reaches the template with its reasoning, calls and results; reasoning_effort reaches it too."""

from __future__ import annotations

import json
from contextlib import contextmanager

import anthropic
import openai
import pytest
from fake_client import ScriptedClient
from starlette.testclient import TestClient

from inferd.server.app import ServerSettings, create_app
from inferd.server.openai.tool_calls import ToolSettings

THINK = "<|channel|>analysis<|message|>Need the weather tool.<|end|>"
ANSWER = THINK + "<|start|>assistant<|channel|>final<|message|>It is sunny."
CALL = (
    THINK + "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}'
)  # <|return|> / <|call|> are stop tokens: they end the reply without reaching its text
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
HARMONY = ToolSettings("harmony", True, "harmony", harmony=True)


@contextmanager
def served(reply: str):
    fake = ScriptedClient(lambda ids, params, k: reply)
    fake.tokenizer.chat_template = "{{ reasoning_effort }}"  # a template that reads it
    with TestClient(create_app(fake, ServerSettings(tools=HARMONY))) as http:
        yield http, fake


def chat(http, **body):
    r = http.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 400, **body})
    assert r.status_code == 200, r.text
    return r


def chunks_of(http, **body) -> list[dict]:
    r = chat(http, stream=True, **body)
    assert "<|" not in r.text
    return [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]


def test_chat_answer_with_reasoning_whole_and_streamed():
    with served(ANSWER) as (http, fake):
        choice = chat(http).json()["choices"][0]
        assert fake.last[2].skip_special_tokens is False  # the parser reads the markers
        chunks = chunks_of(http)
    assert choice["message"] == {
        "role": "assistant",
        "content": "It is sunny.",
        "reasoning_content": "Need the weather tool.",
    }
    assert choice["finish_reason"] == "stop"
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Need the weather tool."
    assert "".join(d.get("content") or "" for d in deltas) == "It is sunny."
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_chat_tool_call_whole_and_streamed():
    with served(CALL) as (http, _):
        choice = chat(http, tools=TOOLS).json()["choices"][0]
        chunks = chunks_of(http, tools=TOOLS)
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] is None and message["reasoning_content"] == "Need the weather tool."
    [call] = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    calls = [
        t for c in chunks if c["choices"] for t in c["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    assert all("id" not in t for t in calls[1:])  # announced once, then argument text
    assert "".join(t["function"]["arguments"] for t in calls) == '{"city": "Paris"}'
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_without_tools_a_call_stays_content_and_forced_calls_are_refused():
    with served(CALL) as (http, _):
        message = chat(http).json()["choices"][0]["message"]
        body = {"messages": ASK, "tools": TOOLS, "tool_choice": "required"}
        forced = http.post("/v1/chat/completions", json=body)
    assert message["content"] == '{"city": "Paris"}' and "tool_calls" not in message
    assert forced.status_code == 400 and forced.json()["error"]["param"] == "tool_choice"


def test_responses_reasoning_item_then_call_whole_and_streamed():
    with served(CALL) as (http, _):
        sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http,
                            max_retries=0)  # fmt: skip
        tools = [{"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]
                  ["parameters"]}]  # fmt: skip
        ask = {"model": "fake-model", "input": "Weather?", "tools": tools, "store": False,
               "max_output_tokens": 400}  # fmt: skip
        whole = sdk.responses.create(**ask, reasoning={"effort": "high"})
        with sdk.responses.stream(**ask) as stream:
            kinds = [e.type for e in stream]
            final = stream.get_final_response()
    for response in (whole, final):
        reasoning, call = response.output
        assert reasoning.type == "reasoning" and reasoning.summary == []
        assert [c.text for c in reasoning.content] == ["Need the weather tool."]
        assert (call.type, call.name, call.arguments) == ("function_call", "get_weather",
                                                          '{"city": "Paris"}')  # fmt: skip
    assert whole.reasoning.effort == "high"
    assert "response.reasoning_text.delta" in kinds and "response.reasoning_text.done" in kinds
    assert kinds.index("response.reasoning_text.done") < kinds.index(
        "response.function_call_arguments.delta"
    )


def test_anthropic_thinking_block_then_tool_use_whole_and_streamed():
    tool = {"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}
    with served(CALL) as (http, _):
        sdk = anthropic.Anthropic(base_url="http://testserver", api_key="x", http_client=http,
                                  max_retries=0)  # fmt: skip
        ask = {"model": "fake-model", "max_tokens": 400, "messages": ASK, "tools": [tool]}
        whole = sdk.messages.create(**ask)
        with sdk.messages.stream(**ask) as stream:
            deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
            final = stream.get_final_message()
    for message in (whole, final):
        thinking, use = message.content
        assert (thinking.type, thinking.thinking) == ("thinking", "Need the weather tool.")
        assert (use.type, use.name, use.input) == ("tool_use", "get_weather", {"city": "Paris"})
        assert message.stop_reason == "tool_use"
    assert deltas[0] == "thinking_delta" and "input_json_delta" in deltas


HISTORY = [
    *ASK,
    {"role": "assistant", "content": None, "reasoning_content": "Need the weather tool.",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]  # fmt: skip


@pytest.mark.parametrize("route", ["chat", "responses", "anthropic"])
def test_the_conversation_sent_back_reaches_the_template(route):
    bodies = {
        "chat": ("/v1/chat/completions", {"messages": HISTORY, "tools": TOOLS}),
        "responses": ("/v1/responses", {"input": [
            *ASK,
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "Need the weather tool."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ], "store": False}),
        "anthropic": ("/v1/messages", {"max_tokens": 50, "messages": [
            *ASK,
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Need the weather tool.", "signature": ""},
                {"type": "tool_use", "id": "call_1", "name": "get_weather",
                 "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"}]},
        ]}),
    }  # fmt: skip
    path, body = bodies[route]
    with served(ANSWER) as (http, fake):
        r = http.post(path, json=body)
        assert r.status_code == 200, r.text
        _, assistant, result = fake.tokenizer.last_call["messages"]
    assert assistant["thinking"] == assistant["reasoning_content"] == "Need the weather tool."
    assert not assistant["content"]
    assert assistant["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert (result["role"], result["content"]) == ("tool", "sunny")


def test_reasoning_effort_reaches_the_template_or_is_refused():
    with served(ANSWER) as (http, fake):
        chat(http, reasoning_effort="low")
        kwargs = fake.tokenizer.last_call["chat_template_kwargs"]
        bad = http.post("/v1/chat/completions", json={"messages": ASK, "reasoning_effort": "max"})
        clash = http.post("/v1/chat/completions", json={
            "messages": ASK, "reasoning_effort": "low",
            "chat_template_kwargs": {"reasoning_effort": "high"}})  # fmt: skip
        fake.tokenizer.chat_template = "no such variable"
        unread = http.post(
            "/v1/chat/completions", json={"messages": ASK, "reasoning_effort": "low"}
        )
    assert kwargs == {"reasoning_effort": "low"}
    for r in (bad, clash, unread):
        assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort", r.text
    assert "does not read it" in unread.json()["error"]["message"]


@pytest.mark.parametrize(
    "family, flag, outcome",
    [
        ("harmony", None, "harmony"),  # the family's format: every reply read as harmony
        ("harmony", "openai", "harmony"),  # vLLM's name for it
        ("hermes", "harmony", "harmony"),  # asked for on a model whose record does not say so
        ("harmony", "hermes", "refused"),  # no other parser can read harmony replies
        ("hermes", None, "hermes"),
    ],
)
def test_serve_settings_for_harmony(monkeypatch, family, flag, outcome):
    import argparse
    from types import SimpleNamespace

    import inferd.loader
    from inferd.commands.serve_features import tool_settings

    monkeypatch.setattr(inferd.loader, "architecture",
                        lambda name: SimpleNamespace(tool_call_format=family))  # fmt: skip
    engine = SimpleNamespace(tokenizer=SimpleNamespace(chat_template="{{ tools }}"),
                             model_config=SimpleNamespace(architecture="any"))  # fmt: skip
    args = argparse.Namespace(tool_call_parser=flag, enable_auto_tool_choice=flag is not None)
    if outcome == "refused":
        with pytest.raises(ValueError, match="--tool-call-parser hermes: this model answers in"):
            tool_settings(engine, args)
        return
    settings = tool_settings(engine, args)
    assert (settings.forced_format, settings.harmony) == (outcome, outcome == "harmony")
    assert settings.template is None  # the model's own template shows tools


def test_a_stored_response_is_continued_with_its_reasoning():
    with served(ANSWER) as (http, fake):
        first = http.post("/v1/responses", json={"input": "Weather?", "max_output_tokens": 400})
        body = {"input": "Thanks", "previous_response_id": first.json()["id"]}
        assert http.post("/v1/responses", json=body).status_code == 200
        _, assistant, _ = fake.tokenizer.last_call["messages"]
    assert [i["type"] for i in first.json()["output"]] == ["reasoning", "message"]
    assert assistant["content"] == "It is sunny."
    assert assistant["thinking"] == "Need the weather tool."

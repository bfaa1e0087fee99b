"""Tool calling on /v1/chat/completions, on a scripted engine (no model): the parsers turn a
reply into `tool_calls` (whole and streamed, as OpenAI sends them), finish_reason follows
OpenAI, and tool_choice follows vLLM's flag rules."""

from __future__ import annotations

import json

import pytest
from fake_client import ScriptedClient
from starlette.testclient import TestClient

from inferd.server.app import ServerSettings, create_app
from inferd.server.openai.tool_calls import ToolSettings

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
PYTHONIC = '[get_weather(city="Paris")]'
HERMES = (
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
    "\n</tool_call>"
)


def app(reply: str, tools: ToolSettings):
    fake = ScriptedClient(lambda ids, params, k: reply)
    return TestClient(create_app(fake, ServerSettings(tools=tools))), fake


AUTO_PYTHONIC = ToolSettings("pythonic", True, "pythonic")


def chat(http, **body):
    return http.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 200, **body})


def stream_chunks(http, **body) -> list[dict]:
    r = chat(http, stream=True, **body)
    assert r.status_code == 200, r.text
    return [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]


@pytest.mark.parametrize(
    "fmt, reply, content",
    [("pythonic", PYTHONIC, None), ("hermes", HERMES, "Let me check.")],
)
def test_auto_turns_the_reply_into_tool_calls(fmt, reply, content):
    http, _ = app(reply, ToolSettings(fmt, True, fmt))
    with http:
        r = chat(http, tools=TOOLS)
    [choice] = r.json()["choices"]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == content
    [call] = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_streamed_calls_arrive_as_openai_sends_them():
    http, _ = app(PYTHONIC, AUTO_PYTHONIC)
    with http:
        chunks = stream_chunks(http, tools=TOOLS)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    calls = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    first = calls[0][0]
    # The first fragment announces the call: index, id, type and the function's name.
    assert first["index"] == 0 and first["id"].startswith("call_") and first["type"] == "function"
    assert first["function"]["name"] == "get_weather"
    later = [c for group in calls[1:] for c in group]
    assert all(set(c) == {"index", "function"} and "name" not in c["function"] for c in later)
    arguments = "".join(c["function"]["arguments"] for group in calls for c in group)
    assert json.loads(arguments) == {"city": "Paris"}
    assert not any(d.get("content") for d in deltas[1:])  # the call is not shown as text
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_plain_answer_stays_content_with_tools_offered():
    http, _ = app("It is sunny.", AUTO_PYTHONIC)
    with http:
        r = chat(http, tools=TOOLS)
        streamed = stream_chunks(http, tools=TOOLS)
    choice = r.json()["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "It is sunny."}
    assert choice["finish_reason"] == "stop"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in streamed)
    assert text == "It is sunny." and streamed[-1]["choices"][0]["finish_reason"] == "stop"


def test_auto_needs_both_flags_but_forced_calls_do_not():
    http, fake = app(PYTHONIC, ToolSettings(None, False, "pythonic"))
    with http:
        r = chat(http, tools=TOOLS)  # tool_choice defaults to auto when tools are given
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
        assert "--enable-auto-tool-choice" in r.json()["error"]["message"]
        required = chat(http, tools=TOOLS, tool_choice="required").json()["choices"][0]
        spec = fake.last[2].structured_outputs
        named = chat(
            http, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}}
        )
    # Forced calls are constrained by a grammar in the call format, then parsed back.
    assert spec.origin == "tools" and spec.grammar.startswith("start: ")
    assert required["finish_reason"] == "tool_calls" and required["message"]["tool_calls"]
    named = named.json()["choices"][0]
    assert named["finish_reason"] == "stop" and named["message"]["tool_calls"]  # as OpenAI


def test_tool_choice_errors_name_the_field():
    http, _ = app(PYTHONIC, AUTO_PYTHONIC)
    with http:
        unknown = chat(
            http, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}
        )
        both = chat(http, tools=TOOLS, tool_choice="required", guided_regex="a")
        bad_history = chat(
            http,
            messages=[
                *ASK,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": "{oops"},
                        }
                    ],
                },
            ],
        )
    assert unknown.status_code == 400 and "'nope'" in unknown.json()["error"]["message"]
    assert both.status_code == 400 and both.json()["error"]["param"] == "tool_choice"
    assert bad_history.status_code == 400
    assert "messages[1].tool_calls[0].function.arguments" in bad_history.json()["error"]["message"]


def test_history_with_calls_and_results_reaches_the_template_as_objects():
    http, fake = app("It is 21 degrees.", AUTO_PYTHONIC)
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "21C"},
    ]
    with http:
        r = chat(http, messages=history, tools=TOOLS)
    assert r.status_code == 200
    rendered = fake.last[1]["prompt"]
    assert rendered.startswith("tools:1|") and "tool:21C|" in rendered
    call = fake.tokenizer.last_call["messages"][1]["tool_calls"][0]
    assert call["function"]["arguments"] == {"city": "Paris"}  # parsed, as HF and vLLM do


@pytest.mark.parametrize("choice", [None, "none", "auto"])
def test_an_empty_tools_list_is_no_tools(choice):
    """`tools: []` (the OpenAI Agents SDK's, for an agent without tools) is read as absent, as
    OpenAI and vLLM read it: no tools in the prompt, a text reply, even without a parser."""
    http, fake = app("hello", ToolSettings())
    with http:
        r = chat(http, tools=[], **({} if choice is None else {"tool_choice": choice}))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "hello"
    assert "tools" not in fake.tokenizer.last_call


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "f"}}])
def test_a_call_that_must_be_made_needs_a_tool(choice):
    http, _ = app("hello", AUTO_PYTHONIC)
    with http:
        r = chat(http, tools=[], tool_choice=choice)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "tool_choice"
    assert "tools is empty" in r.json()["error"]["message"]

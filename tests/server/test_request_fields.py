"""Every field of every request body, table-driven: each is honoured (a check of what reached the
engine or came back) or refused with 400 "unsupported parameter: NAME". A field added to a body
without a row here fails `test_the_table_covers_every_declared_field`.

The app runs on a scripted engine client (fake_client.py): no model, milliseconds; what the
engine itself does with a field (allowed_token_ids, truncation, grammars, ...) is tested in
tests/unit/test_structured_engine.py and end to end in test_structured_and_tools.py."""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from fake_client import BOS, ScriptedClient
from starlette.testclient import TestClient

from inferd.server.app import ServerSettings, create_app
from inferd.server.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    GenerateRequest,
    TokenizeRequest,
)
from inferd.server.openai.tool_calls import ToolSettings

CMPL, CHAT, GEN, TOK, DETOK = (
    "/v1/completions",
    "/v1/chat/completions",
    "/generate",
    "/tokenize",
    "/detokenize",
)
MODELS = {
    CMPL: CompletionRequest,
    CHAT: ChatCompletionRequest,
    GEN: GenerateRequest,
    TOK: TokenizeRequest,
    DETOK: DetokenizeRequest,
}
USER = [{"role": "user", "content": "hi"}]
BASE = {
    CMPL: {"prompt": "hi", "max_tokens": 40},
    CHAT: {"messages": USER, "max_tokens": 40},
    GEN: {"prompt": "hi", "max_tokens": 40},
    TOK: {"prompt": "hi"},
    DETOK: {"tokens": [104, 105]},
}
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
CALL = '[get_weather(city="Paris")]'


@dataclass
class Seen:
    """What a request produced: the response, what reached the engine, the log."""

    response: Any
    fake: ScriptedClient
    logs: str

    @property
    def json(self) -> dict:
        return self.response.json()

    @property
    def params(self):
        return self.fake.last[2]

    @property
    def prompt_ids(self) -> list[int]:
        return self.fake.last[1]["prompt_token_ids"]

    @property
    def template_call(self) -> dict:
        return self.fake.tokenizer.last_call

    def events(self) -> list[dict]:
        lines = self.response.text.splitlines()
        return [json.loads(x[6:]) for x in lines if x.startswith("data: {")]


# ---- checks -------------------------------------------------------------------------------------
def that(predicate):
    def check(s: Seen):
        assert predicate(s), s.response.text

    return check


def param(name, expected):
    def check(s: Seen):
        assert getattr(s.params, name) == expected, (name, getattr(s.params, name))

    return check


def spec(kind, expected):
    def check(s: Seen):
        assert getattr(s.params.structured_outputs, kind) == expected

    return check


def ok(s: Seen):
    assert s.response.status_code == 200


def not_found(s: Seen):
    assert s.response.status_code == 404 and s.json["error"]["param"] == "model"


def refused(name):
    """400 naming the field (and, for fields this server does not have, saying so)."""

    def check(s: Seen):
        assert s.response.status_code == 400, s.response.text
        error = s.json["error"]
        assert error["param"] == name and name in error["message"], error

    check.refusal = True
    return check


def unsupported(name):
    check = refused(name)

    def both(s: Seen):
        check(s)
        assert s.json["error"]["message"].startswith("unsupported parameter: "), s.json

    both.refusal = True
    return both


def logged_user(name):
    def check(s: Seen):
        assert f"user='{name}'" in s.logs, s.logs

    return check


def first_choice(s: Seen) -> dict:
    return s.json["choices"][0]


def on_server(check, **settings):
    """The row runs on a server started with these ServerSettings (the tools' besides)."""
    check.settings = settings
    return check


def timeline_of_the_request(entry: dict, s: Seen) -> bool:
    """A `timeline` entry describes the request that reached the engine."""
    return (
        entry["request_id"] == s.fake.last[0]
        and entry["prompt_tokens"] == len(s.prompt_ids)
        and entry["events"][0]["event"] == "arrived"
    )


# ---- the table: (routes, field, value, check[, extra body]) -------------------------------------
GENERATION = (CMPL, CHAT, GEN)
OPENAI = (CMPL, CHAT)
ROWS: list[tuple[tuple[str, ...], str, Any, Any, dict]] = []


def row(routes, field, value, check, **extra):
    ROWS.append((routes if isinstance(routes, tuple) else (routes,), field, value, check, extra))


row(GENERATION + (TOK, DETOK), "model", "fake-model", ok)
row(GENERATION + (TOK, DETOK), "model", "other-model", not_found)
for name, value, expected in [
    ("temperature", 0.5, 0.5),
    ("top_p", 0.5, 0.5),
    ("top_k", 5, 5),
    ("min_p", 0.1, 0.1),
    ("seed", 7, 7),
    ("seed", -(1 << 63), -(1 << 63)),
    ("seed", (1 << 63) - 1, (1 << 63) - 1),
    ("stop", ["x"], ["x"]),
    ("stop", "x", ["x"]),
    ("stop_token_ids", [9], [9]),
    ("presence_penalty", 0.5, 0.5),
    ("frequency_penalty", -0.5, -0.5),
    ("repetition_penalty", 1.1, 1.1),
    ("logit_bias", {"5": 1.5}, {5: 1.5}),
    ("min_tokens", 1, 1),
    ("ignore_eos", True, True),
    ("skip_special_tokens", False, False),
    ("include_stop_str_in_output", True, True),
    ("allowed_token_ids", [105, 104], [104, 105]),
]:
    row(GENERATION, name, value, param(name, expected))
row(GENERATION, "seed", 1 << 63, refused("seed"))  # vLLM's bound: a 64-bit signed integer
row(OPENAI, "n", 2, param("n", 2))
row(GEN, "n", 1, param("n", 1))
row(GEN, "n", 2, refused("n"))
row(GENERATION, "truncate_prompt_tokens", 2, that(lambda s: len(s.prompt_ids) == 2))
row(GENERATION, "response_format", {"type": "json_object"}, spec("json_object", True))
row(GENERATION, "response_format", {"type": "text"}, param("structured_outputs", None))
row(GENERATION, "response_format", {"type": "sound"}, refused("response_format.type"))
row(  # llama.cpp's way to give a schema
    GENERATION,
    "response_format",
    {"type": "json_object", "schema": {"const": "42"}},
    spec("json", {"const": "42"}),
)
row(GENERATION, "response_format", {"type": "json_object", "schema": 123},
    refused("response_format.schema"))  # fmt: skip
row(GENERATION, "response_format", {"type": "json_object", "foo": 1},
    unsupported("response_format.foo"))  # fmt: skip
row(GENERATION, "response_format", {"type": "text", "schema": {}},
    unsupported("response_format.schema"))  # fmt: skip
row(
    GENERATION,
    "response_format",
    {"type": "json_schema", "json_schema": {"schema": {"type": "object"}, "strcit": True}},
    unsupported("response_format.json_schema.strcit"),
)
row(
    GENERATION,
    "response_format",
    {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True},
    },
    that(lambda s: s.params.structured_outputs.closes_objects),
)
row(GENERATION, "structured_outputs", {"regex": "a+"}, spec("regex", "a+"))
row(GENERATION, "structured_outputs", {"regexp": "a+"}, unsupported("structured_outputs.regexp"))
row(GENERATION, "guided_json", {"type": "object"}, spec("json", {"type": "object"}))
row(GENERATION, "guided_regex", "a+", spec("regex", "a+"))
row(GENERATION, "guided_choice", ["a", "b"], spec("choice", ["a", "b"]))
row(GENERATION, "guided_grammar", 'start: "a"', spec("grammar", 'start: "a"'))
row(GENERATION, "guided_decoding_backend", "llguidance", ok)
row(GENERATION, "guided_decoding_backend", "xgrammar", unsupported("guided_decoding_backend"))
row(GENERATION, "user", "alice", logged_user("alice"))
row(GENERATION, "safety_identifier", "bob", logged_user("bob"))
row(GENERATION, "cache_salt", "t-a", that(lambda s: s.fake.last[1]["cache_salt"] == "t-a"))
row(GENERATION, "cache_salt", "", refused("cache_salt"))
row(GENERATION, "return_timeline", False, that(lambda s: "timeline" not in s.json))
row(GENERATION, "return_timeline", True, refused("return_timeline"))  # not enabled
TIMELINE_ON = {"enable_request_timeline": True}
row(
    OPENAI,
    "return_timeline",
    True,
    on_server(that(lambda s: timeline_of_the_request(s.json["timeline"][0], s)), **TIMELINE_ON),
)
row(
    OPENAI,
    "return_timeline",
    True,
    on_server(
        that(lambda s: timeline_of_the_request(s.events()[-1]["timeline"][0], s)), **TIMELINE_ON
    ),
    stream=True,
)
row(
    GEN,
    "return_timeline",
    True,
    on_server(that(lambda s: timeline_of_the_request(s.json["timeline"], s)), **TIMELINE_ON),
)
for name, no_op, other in [
    ("use_beam_search", False, True),
    ("length_penalty", 1.0, 2.0),
    ("spaces_between_special_tokens", True, False),
]:
    row(GENERATION, name, no_op, ok)
    row(GENERATION, name, other, unsupported(name))

# The prompt carries it to the engine, which refuses it under fcfs (tests/parity/
# test_priority_engine.py) and orders its queue by it under --scheduling-policy priority.
row(GENERATION, "priority", 3, that(lambda s: s.fake.last[1]["priority"] == 3))
row(OPENAI, "stream", True, that(lambda s: s.events()[-1]["choices"][-1]["finish_reason"]))
row(
    OPENAI,
    "stream_options",
    {"include_usage": True},
    that(lambda s: s.events()[-1]["usage"]["completion_tokens"] == 5),
    stream=True,
)
row(
    OPENAI,
    "stream_options",
    {"include_usage": True, "continuous_usage_stats": True},
    that(lambda s: all("usage" in e for e in s.events())),
    stream=True,
)
row(
    OPENAI,
    "stream_options",
    {"include_usage": False, "continuous_usage_stats": True},  # vLLM: no usage at all
    that(lambda s: not any("usage" in e for e in s.events())),
    stream=True,
)
row(OPENAI, "stream_options", {"include_usage": True}, refused("stream_options"))
row(OPENAI, "stream_options", {"foo": True}, unsupported("stream_options.foo"), stream=True)
row(
    CMPL,
    "prompt_logprobs",
    1,
    that(
        lambda s: (
            first_choice(s)["prompt_logprobs"][1]
            == {"104": {"logprob": -1.0, "rank": 1, "decoded_token": "h"}}
        )
    ),
)
row(CHAT, "prompt_logprobs", 1, that(lambda s: s.json["prompt_logprobs"][0] is None))
row(OPENAI, "prompt_logprobs", 1, refused("prompt_logprobs"), stream=True)
row(CMPL, "echo", True, that(lambda s: first_choice(s)["text"] == "hihello"))
row(
    CHAT,
    "echo",
    True,
    that(lambda s: first_choice(s)["message"] == {"role": "assistant", "content": "Surehello"}),
    add_generation_prompt=False,
    messages=USER + [{"role": "assistant", "content": "Sure"}],
)
row(CMPL, "request_id", "r1", that(lambda s: s.json["id"] == "cmpl-r1"))
row(CHAT, "request_id", "r1", that(lambda s: s.json["id"] == "chatcmpl-r1"))
row(
    CMPL,
    "return_tokens_as_token_ids",
    True,
    that(lambda s: first_choice(s)["logprobs"]["tokens"][0] == "token_id:104"),
    logprobs=0,
)
row(
    CHAT,
    "return_tokens_as_token_ids",
    True,
    that(lambda s: first_choice(s)["logprobs"]["content"][0]["token"] == "token_id:104"),
    logprobs=True,
)
row(
    CMPL,
    "return_token_ids",
    True,
    that(
        lambda s: (
            (first_choice(s)["token_ids"], first_choice(s)["prompt_token_ids"])
            == ([104, 101, 108, 108, 111], [BOS, 104, 105])
        )
    ),
)
row(
    CHAT,
    "return_token_ids",
    True,
    that(
        lambda s: (
            first_choice(s)["token_ids"] == [104, 101, 108, 108, 111]
            and s.json["prompt_token_ids"] == s.prompt_ids
        )
    ),
)
row(
    OPENAI,
    "return_token_ids",
    True,
    that(
        lambda s: (
            [t for e in s.events() for c in e["choices"] for t in c.get("token_ids", [])]
            == [104, 101, 108, 108, 111]
        )
    ),
    stream=True,
)
row(CMPL, "add_special_tokens", False, that(lambda s: s.prompt_ids == [104, 105]))
row(CHAT, "add_special_tokens", True, that(lambda s: s.prompt_ids[0] == BOS))

row(CMPL, "prompt", [[104], [105]], that(lambda s: len(s.json["choices"]) == 2))
row(GEN, "prompt", [104, 33], that(lambda s: s.prompt_ids == [104, 33]))
row((CMPL, GEN), "max_tokens", 2, param("max_tokens", 2))
row(
    CMPL,
    "logprobs",
    1,
    that(lambda s: first_choice(s)["logprobs"]["top_logprobs"][0] == {"h": -0.25, "<2>": -3.0}),
)
row(CMPL, "best_of", 1, param("n", 1))
row(CMPL, "best_of", 3, refused("best_of"))
row(CMPL, "suffix", "", ok)
row(CMPL, "suffix", "end", refused("suffix"))  # the fake model has no FIM tokens (test_infill.py)

row(CHAT, "messages", USER * 2, that(lambda s: "user:hi|user:hi|gen|" in s.fake.last[1]["prompt"]))
row(CHAT, "max_tokens", 3, param("max_tokens", 3))
row(CHAT, "max_completion_tokens", 4, param("max_tokens", 4), max_tokens=9)
row(
    CHAT,
    "logprobs",
    True,
    that(lambda s: first_choice(s)["logprobs"]["content"][0]["token"] == "h"),
)
row(
    CHAT,
    "top_logprobs",
    1,
    that(lambda s: len(first_choice(s)["logprobs"]["content"][0]["top_logprobs"]) == 1),
    logprobs=True,
)
row(CHAT, "add_generation_prompt", False, that(lambda s: s.fake.last[1]["prompt"] == "user:hi|"))
row(
    TOK,
    "add_generation_prompt",
    False,
    that(lambda s: s.fake.tokenizer.decode(s.json["tokens"]) == "user:hi|"),
)
row((CHAT, TOK), "continue_final_message", True, refused("continue_final_message"))
row(
    (CHAT, TOK),
    "continue_final_message",
    True,
    that(lambda s: s.template_call["continue_final_message"]),
    add_generation_prompt=False,
)
row(
    (CHAT, TOK),
    "chat_template_kwargs",
    {"x": 1},
    that(lambda s: s.template_call["chat_template_kwargs"] == {"x": 1}),
)
row((CHAT, TOK), "chat_template_kwargs", {"tools": []}, refused("chat_template_kwargs"))
row((CHAT, TOK), "chat_template_kwargs", {"tokenize": True}, refused("chat_template_kwargs"))
row(
    (CHAT, TOK),
    "split_special_tokens",
    False,
    that(lambda s: s.template_call["split_special_tokens"] is False),
)
row(CHAT, "tools", TOOLS, that(lambda s: s.template_call["tools"] == TOOLS))
row(TOK, "tools", TOOLS, that(lambda s: s.template_call["tools"] == TOOLS))
row(CHAT, "tools", [{"type": "retrieval"}], refused("tools[0].type"))
row(
    CHAT,
    "tool_choice",
    "required",
    that(
        lambda s: (
            first_choice(s)["message"]["tool_calls"][0]["function"]
            == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
        )
    ),
    tools=TOOLS,
)
row(CHAT, "tool_choice", "none", that(lambda s: "tools" not in s.template_call), tools=TOOLS)
row(CHAT, "tool_choice", "auto", refused("tool_choice"))  # no tools
row(
    CHAT,
    "parallel_tool_calls",
    False,
    that(lambda s: len(first_choice(s)["message"]["tool_calls"]) == 1),
    tools=TOOLS,
    tool_choice="auto",
    max_tokens=80,
)
row(CHAT, "modalities", ["text"], ok)
row(CHAT, "modalities", ["audio"], unsupported("modalities"))
row(CHAT, "store", False, ok)
row(CHAT, "store", True, unsupported("store"))
# The fake template does not read reasoning_effort (test_harmony_server.py has one that does).
row(CHAT, "reasoning_effort", "low", refused("reasoning_effort"))

for name, value in [
    ("add_generation_prompt", False),
    ("split_special_tokens", False),
    ("tools", TOOLS),
    ("continue_final_message", True),
]:
    ROWS.append(((TOK,), name, value, refused(name), {"prompt": "hi", "messages": None}))
row(TOK, "prompt", "hey", that(lambda s: s.json["tokens"] == [BOS, 104, 101, 121]))
row(TOK, "messages", USER, that(lambda s: s.json["tokens"][0] != BOS))
row(TOK, "add_special_tokens", False, that(lambda s: s.json["tokens"] == [104, 105]))
row(TOK, "return_token_strs", True, that(lambda s: s.json["token_strs"] == ["<1>", "h", "i"]))
row(DETOK, "tokens", [104, 105, 33], that(lambda s: s.json["prompt"] == "hi!"))

# /tokenize fields that apply to a conversation: their rows send `messages`, not `prompt`.
TOK_CHAT_FIELDS = {
    "messages",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
    "split_special_tokens",
    "tools",
}


def body_for(route: str, field: str, value: Any, extra: dict) -> dict:
    body = {**BASE[route], **extra, field: value}
    if route == TOK and field in TOK_CHAT_FIELDS and "prompt" not in extra:
        body.pop("prompt")
        body.setdefault("messages", USER)
    return {k: v for k, v in body.items() if v is not None}  # None in `extra`: leave out


@contextmanager
def open_app(**settings):
    fake = ScriptedClient(lambda ids, p, k: "hello")
    tools = ToolSettings("pythonic", True, "pythonic")
    with TestClient(create_app(fake, ServerSettings(tools=tools, **settings))) as http:
        yield http, fake


@pytest.fixture
def app():
    with open_app() as opened:
        yield opened


CASES = [
    (route, field, value, check, extra)
    for routes, field, value, check, extra in ROWS
    for route in routes
]


@pytest.mark.parametrize(
    "route, field, value, check, extra",
    CASES,
    ids=[f"{r}:{f}={json.dumps(v)[:24]}" for r, f, v, _, _ in CASES],
)
def test_each_field_is_honoured_or_refused(caplog, route, field, value, check, extra):
    with open_app(**getattr(check, "settings", {})) as (http, fake):
        _check_row(http, fake, caplog, route, field, value, check, extra)


def _check_row(http, fake, caplog, route, field, value, check, extra):
    if field == "parallel_tool_calls":
        fake.reply = lambda ids, p, k: '[get_weather(city="Paris"), get_weather(city="Rome")]'
    elif extra.get("tools"):
        fake.reply = lambda ids, p, k: CALL
    with caplog.at_level(logging.INFO, logger="inferd.access"):
        response = http.post(route, json=body_for(route, field, value, extra))
    seen = Seen(response, fake, caplog.text)
    if getattr(check, "refusal", False) or check is not_found:
        check(seen)
        return
    assert response.status_code == 200, response.text
    check(seen)


def test_the_table_covers_every_declared_field():
    covered = {(route, field) for route, field, *_ in CASES}
    missing = [
        (route, name)
        for route, model in MODELS.items()
        for name in model.model_fields
        if (route, name) not in covered
    ]
    assert missing == []


@pytest.mark.parametrize("route", list(BASE))
def test_an_undeclared_field_is_refused_by_name(app, route):
    http, _ = app
    response = http.post(route, json={**BASE[route], "frobnicate": 1})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (
        error["message"] == "unsupported parameter: frobnicate" and error["param"] == "frobnicate"
    )

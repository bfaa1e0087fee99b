"""The bundled tool-aware chat templates: tools presented in the first turn, earlier calls written
back in the format the parser reads (round trip), tool results returned in user turns, and the
Gemma one identical to the plain Gemma template when no tools are given."""

from __future__ import annotations

import json

import pytest

from inferd.tokenizer.chat_template import ChatTemplate
from inferd.tokenizer.template_files import default_chat_template
from inferd.tools import get_tool_parser
from inferd.tools.templates import prepare_messages, template_handles_tools, tool_chat_template

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
ARGUMENTS = {"city": 'Paris "FR"', "days": 2, "opts": {"metric": True, "tags": [None, 1.5]}}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps(ARGUMENTS)},
            },
            {"id": "call_2", "type": "function", "function": {"name": "noop", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    {"role": "tool", "tool_call_id": "call_2", "content": "done"},
]


def render(parser: str, messages, **variables) -> str:
    template = ChatTemplate(tool_chat_template(parser))
    return template.render(prepare_messages(messages), True, **variables)


def between(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0]


@pytest.mark.parametrize(
    ("parser", "model_turn", "turn_end", "result_block"),
    [
        (
            "pythonic",
            "<start_of_turn>model\n",
            "<end_of_turn>",
            '```tool_output\n{"temp": 21}\n```',
        ),
        (
            "hermes",
            "<|im_start|>assistant\n",
            "<|im_end|>",
            '<tool_response>\n{"temp": 21}\n</tool_response>',
        ),
    ],
)
def test_round_trip_through_the_parser(parser, model_turn, turn_end, result_block):
    prompt = render(parser, CONVERSATION, tools=TOOLS, bos_token="<bos>")
    assert "Current weather of a city" in prompt and "Be brief." in prompt
    assert prompt.endswith(model_turn)
    assert prompt.count(model_turn) == 2
    assert result_block in prompt and "done" in prompt
    # The earlier call, as written into the prompt, parses back into the same call.
    content, calls = get_tool_parser(parser).extract(between(prompt, model_turn, turn_end))
    assert content == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", ARGUMENTS),
        ("noop", {}),
    ]


def test_gemma_tool_results_share_one_user_turn():
    prompt = render("pythonic", CONVERSATION, tools=TOOLS, bos_token="<bos>")
    last_user = prompt.rsplit("<start_of_turn>user\n", 1)[1]
    assert last_user.startswith("```tool_output") and last_user.count("```tool_output") == 2
    assert prompt.count("<start_of_turn>user\n") == 2


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "Sys"}, {"role": "user", "content": " Hi "}],
        [
            {"role": "user", "content": [{"type": "text", "text": "a"}]},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ],
        [{"role": "system", "content": "Only a system message"}],
    ],
)
def test_gemma_without_tools_renders_like_the_plain_template(messages):
    plain = ChatTemplate(default_chat_template("gemma3"))
    for generation_prompt in (True, False):
        expected = plain.render(messages, generation_prompt, bos_token="<bos>")
        got = ChatTemplate(tool_chat_template("pythonic")).render(
            messages, generation_prompt, bos_token="<bos>"
        )
        assert got == expected


def test_gemma_refuses_a_conversation_it_cannot_express():
    with pytest.raises(ValueError, match="alternate user/assistant"):
        render("pythonic", [{"role": "assistant", "content": "hi"}], bos_token="<bos>")
    with pytest.raises(ValueError, match="got role 'developer'"):
        render("pythonic", [{"role": "developer", "content": "x"}], bos_token="<bos>")
    unprepared = [CONVERSATION[1], CONVERSATION[2]]
    with pytest.raises(ValueError, match="arguments must be an object"):
        ChatTemplate(tool_chat_template("pythonic")).render(unprepared, True, bos_token="")


def test_chatml_writes_string_arguments_as_they_are():
    unprepared = ChatTemplate(tool_chat_template("hermes")).render(CONVERSATION[1:3], False)
    _, calls = get_tool_parser("hermes").extract(unprepared.split("assistant\n")[1])
    assert json.loads(calls[0].arguments) == ARGUMENTS


def test_prepare_messages():
    prepared = prepare_messages(CONVERSATION)
    assert prepared[2]["tool_calls"][0]["function"]["arguments"] == ARGUMENTS
    assert isinstance(CONVERSATION[2]["tool_calls"][0]["function"]["arguments"], str)  # a copy
    bad = [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}]
    with pytest.raises(ValueError, match=r"messages\[0\]\.tool_calls\[0\]\.function\.arguments"):
        prepare_messages(bad)
    bad[0]["tool_calls"][0]["function"]["arguments"] = "[1]"
    with pytest.raises(ValueError, match="must be a JSON object"):
        prepare_messages(bad)


def test_template_handles_tools():
    assert template_handles_tools(tool_chat_template("hermes"))
    assert not template_handles_tools(default_chat_template("gemma3"))
    assert not template_handles_tools(None)
    with pytest.raises(ValueError, match="no tool chat template for parser 'xml'"):
        tool_chat_template("xml")

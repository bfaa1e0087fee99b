"""tool_choice "required" / a named function as grammars: they accept well-formed calls in the
parser's format and reject calls whose arguments break the function's schema; replies sampled
under them always parse into calls with valid arguments."""

from __future__ import annotations

import itertools
import json
import re

import pytest
from structured_vocab import constrained_run, decode, small_info

from inferd.structured.manager import GrammarManager
from inferd.tools import get_tool_parser
from inferd.tools.constrain import tool_call_spec

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "metric": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", None]}, "maxItems": 2},
        "where": {"type": "object", "properties": {"lat": {"type": ["number", "null"]}}},
    },
    "required": ["city"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "noop"}},
]
NOOP = {"type": "function", "function": {"name": "noop"}}


@pytest.fixture(scope="module")
def manager():
    with GrammarManager(small_info()) as m:
        yield m


def accepts(manager, spec, text: str) -> bool:
    matcher = manager.compile(spec)
    return matcher.accept_tokens(list(text.encode())) and matcher.is_complete


def valid_weather(arguments: dict) -> bool:
    keys = set(arguments)
    return (
        "city" in keys
        and keys <= set(WEATHER["properties"])
        and isinstance(arguments["city"], str)
        and len(arguments["city"]) <= 8
        and (type(arguments.get("days", 1)) is int and 1 <= arguments.get("days", 1) <= 7)
        and isinstance(arguments.get("metric", True), bool)
        and all(t in ("a", "b", None) for t in arguments.get("tags", []))
        and len(arguments.get("tags", [])) <= 2
        and set(arguments.get("where", {})) <= {"lat"}
    )


PYTHONIC = [
    ('[get_weather(city="Paris")]', True),
    ('[get_weather(city="Paris", days=3, metric=True, tags=["a", None])]', True),
    ('[get_weather(city="Rome", where={"lat": 41.9})]', True),
    ('[get_weather(city="Rome", where={"lat": None})]', True),
    ('[get_weather(city="Paris"), noop()]', True),
    ("[noop()]", True),
    ("[get_weather(days=3)]", False),  # required city missing
    ('[get_weather(city="Paris", days=9)]', False),  # above maximum
    ('[get_weather(city="Paris", metric=true)]', False),  # JSON, not Python
    ('[get_weather(city="Paris", zzz=1)]', False),  # undeclared
    ('[get_weather(days=3, city="Paris")]', False),  # schema order
    ('[get_weather(city="Paris", tags=["c"])]', False),
    ('[get_weather(city="Montpellier")]', False),  # maxLength
    ('[get_weather(city="P\\/")]', False),  # \/ means something else in Python
    ("[]", False),
    ("noop()", False),
]
WEATHER_CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'
HERMES = [
    (f"<tool_call>\n{WEATHER_CALL}\n</tool_call>", True),
    ('<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>', True),
    (
        '<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "x"}}\n</tool_call>',
        True,
    ),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"days": 3}}\n</tool_call>', False),
    ('<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>', False),
    (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "x", "zzz": 1}}\n</tool_call>',
        False,
    ),
    ("Sure.", False),
]


@pytest.mark.parametrize(
    ("parser", "text", "ok"),
    [("pythonic", *c) for c in PYTHONIC] + [("hermes", *c) for c in HERMES],
)
def test_required_accepts_exactly_valid_calls(manager, parser, text, ok):
    assert accepts(manager, tool_call_spec(TOOLS, "required", parser), text) is ok
    if ok:  # and the parser reads back what the grammar let through
        _, calls = get_tool_parser(parser).extract(text)
        assert calls and all(c.name in ("get_weather", "noop") for c in calls)


@pytest.mark.parametrize("parser", ["pythonic", "hermes"])
def test_named_function_forces_one_call_of_it(manager, parser):
    spec = tool_call_spec(TOOLS, NOOP, parser)
    one = (
        "[noop()]"
        if parser == "pythonic"
        else '<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>'
    )
    assert accepts(manager, spec, one)
    assert not accepts(
        manager, spec, one[:-1] + ", noop()]" if parser == "pythonic" else one + "\n" + one
    )
    other = (
        '[get_weather(city="x")]' if parser == "pythonic" else one.replace("noop", "get_weather")
    )
    assert not accepts(manager, spec, other)


@pytest.mark.parametrize("parser", ["pythonic", "hermes"])
def test_sampled_replies_are_valid_calls(manager, parser):
    spec = tool_call_spec(TOOLS, "required", parser)
    tool_parser = get_tool_parser(parser)
    names = set()
    for seed in range(30):
        ids = constrained_run(manager.compile(spec), manager.info, seed, max_tokens=400)
        content, calls = tool_parser.extract(decode(ids))
        assert content == "" and calls, decode(ids)
        for call in calls:
            names.add(call.name)
            arguments = json.loads(call.arguments)
            assert arguments == {} if call.name == "noop" else valid_weather(arguments), call
    assert names == {"get_weather", "noop"}


def test_optional_parameters_any_subset_in_order(manager):
    properties = {k: {"type": "integer"} for k in "abcde"}
    tool = {
        "name": "f",
        "parameters": {"type": "object", "properties": properties, "required": ["b", "d"]},
    }
    spec = tool_call_spec([{"type": "function", "function": tool}], "required", "pythonic")
    for r in range(6):
        for keys in itertools.permutations("abcde", r):
            text = "[f(" + ", ".join(f"{k}=1" for k in keys) + ")]"
            expected = list(keys) == sorted(keys) and {"b", "d"} <= set(keys)
            assert accepts(manager, spec, text) is expected, text


def test_nothing_forced_for_none_and_auto():
    for choice in (None, "none", "auto"):
        assert tool_call_spec(TOOLS, choice, "pythonic") is None


@pytest.mark.parametrize(
    ("tools", "choice", "needle"),
    [
        ([], "required", "tool_choice 'required' needs at least one tool"),
        ([{"type": "retrieval"}], "required", "tools[0].type: only"),
        (
            [{"type": "function", "function": {"name": "a b"}}],
            "required",
            "tools[0].function.name must match",
        ),
        ([NOOP, NOOP], "required", "tools[1].function.name 'noop' is not unique"),
        ([NOOP], {"type": "function", "function": {"name": "other"}}, "names function 'other'"),
        ([NOOP], "sometimes", "tool_choice must be"),
        (
            [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {"x": {"$ref": "#/a"}}},
                    },
                }
            ],
            "required",
            "function 'f'.x: JSON schema keyword '$ref' is not supported for pythonic",
        ),
        (
            [{"type": "function", "function": {"name": "my-tool"}}],
            "required",
            "cannot be written as a Python call",
        ),
    ],
)
def test_bad_tools_and_choices_are_value_errors(tools, choice, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        tool_call_spec(tools, choice, "pythonic")

"""Tool-call parsers on fixed replies: whole-reply extraction, and streaming split at every
character boundary giving the same content and calls, in OpenAI's delta shape, with only
possible call text held back."""

from __future__ import annotations

import json

import pytest

from inferd.tools import get_tool_parser
from inferd.tools.types import StreamDelta

PYTHONIC = [
    # (reply, content, [(name, arguments)])
    ('[get_weather(city="Paris")]', "", [("get_weather", {"city": "Paris"})]),
    (
        "[get_weather(city='Paris', days=3), f2(x=1.5, flag=True, none=None)]",
        "",
        [
            ("get_weather", {"city": "Paris", "days": 3}),
            ("f2", {"x": 1.5, "flag": True, "none": None}),
        ],
    ),
    (
        '  [f(items=[1, "a, b", (2, 3)], opts={"k": [True, {"n": -1}]}, s="q\\"uote)]")]  ',
        "",
        [("f", {"items": [1, "a, b", [2, 3]], "opts": {"k": [True, {"n": -1}]}, "s": 'q"uote)]'})],
    ),
    ("[noop()]", "", [("noop", {})]),
    ("[f(a=1,)]\nDone, called f.", "Done, called f.", [("f", {"a": 1})]),
    ('```tool_code\n[g(text="""two\nlines""")]\n```', "", [("g", {"text": "two\nlines"})]),
    ("```python\n[h()]\n```\nThat is all.", "That is all.", [("h", {})]),
    ("The weather is nice.", "The weather is nice.", []),
    ("[1] is a citation.", "[1] is a citation.", []),
    ("[Note: no call here]", "[Note: no call here]", []),
    ("[f(1)]", "[f(1)]", []),  # positional arguments have no name
    ("[f(x=float('nan'))]", "[f(x=float('nan'))]", []),
    ("[f(x={1, 2})]", "[f(x={1, 2})]", []),  # a set has no JSON form
    ('[f(x=__import__("os").getcwd())]', '[f(x=__import__("os").getcwd())]', []),  # never run
    ("[]", "[]", []),
    ("```js\n[f()]\n```", "```js\n[f()]\n```", []),
    ("", "", []),
]

HERMES = [
    (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        'Let me check.\n<tool_call>\n{"name": "a", "arguments": {"x": [1, {"y": "}"}]}}\n'
        '</tool_call>\n<tool_call>{"arguments": {}, "name": "b"}</tool_call>\n',
        "Let me check.",
        [("a", {"x": [1, {"y": "}"}]}), ("b", {})],
    ),
    ('<tool_call>{"name": "c", "parameters": {"q": "é"}}</tool_call>', "", [("c", {"q": "é"})]),
    ('<tool_call>{"name": "d"}</tool_call>', "", [("d", {})]),
    ('<tool_call>{"name": "e", "arguments": {"n": 1}}', "", [("e", {"n": 1})]),  # no end tag
    ('<tool_call>{"name": "f", "arguments": {}}</tool_call> Done.', "Done.", [("f", {})]),
    ("No tools needed.  ", "No tools needed.  ", []),
    ("a < b and <tool>", "a < b and <tool>", []),
    ("x <tool_call>junk</tool_call> y", "x<tool_call>junk</tool_call> y", []),
    ('<tool_call>{"name": 3}</tool_call>', '<tool_call>{"name": 3}</tool_call>', []),
    ('<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),
    (
        '<tool_call>{"name": "g", "arguments": [1]}</tool_call>',
        '<tool_call>{"name": "g", "arguments": [1]}</tool_call>',
        [],
    ),
]

CASES = [("pythonic", *case) for case in PYTHONIC] + [("hermes", *case) for case in HERMES]


def calls_of(calls) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize(("parser", "reply", "content", "calls"), CASES)
def test_extract(parser, reply, content, calls):
    got_content, got_calls = get_tool_parser(parser).extract(reply)
    assert got_content == content
    assert calls_of(got_calls) == calls
    assert len({c.id for c in got_calls}) == len(got_calls)
    for call in got_calls:
        assert call.id.startswith("call_")
        assert call.to_openai() == {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }


def run_stream(parser: str, chunks: list[str]) -> tuple[str, list[dict], list[StreamDelta]]:
    stream = get_tool_parser(parser).stream()
    deltas = [stream.feed(c) for c in chunks] + [stream.finish()]
    content = "".join(d.content for d in deltas)
    entries = [e.to_openai() for d in deltas for e in d.tool_calls]
    return content, entries, deltas


def assemble(entries: list[dict]) -> list[tuple[str, str]]:
    """Tool calls as an OpenAI client rebuilds them from the deltas, checking the shape."""
    calls: list[list[str]] = []
    for e in entries:
        if e["index"] == len(calls):  # first delta of a call: id, type and name
            assert e["id"].startswith("call_") and e["type"] == "function"
            calls.append([e["function"]["name"], e["function"]["arguments"]])
        else:
            assert e["index"] == len(calls) - 1 or e["index"] < len(calls)
            assert set(e) == {"index", "function"} and set(e["function"]) == {"arguments"}
            calls[e["index"]][1] += e["function"]["arguments"]
    return [(name, arguments) for name, arguments in calls]


@pytest.mark.parametrize(("parser", "reply", "content", "calls"), CASES)
def test_stream_split_anywhere_matches_extract(parser, reply, content, calls):
    _, whole_calls = get_tool_parser(parser).extract(reply)
    expected = [(c.name, c.arguments) for c in whole_calls]
    splits = [[reply[:k], reply[k:]] for k in range(len(reply) + 1)] + [list(reply)]
    for chunks in splits:
        got_content, entries, _ = run_stream(parser, chunks)
        assert got_content == content, chunks
        assert assemble(entries) == expected, chunks


def test_stream_sends_calls_as_they_form():
    reply = '[get_weather(city="Paris", days=3), noop()]'
    _, entries, deltas = run_stream("pythonic", list(reply))
    assert entries[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"'}
    # Announced with its first argument, as soon as the "," after it shows that it is complete.
    announced_at = next(i for i, d in enumerate(deltas) if d.tool_calls)
    assert reply[: announced_at + 1] == '[get_weather(city="Paris",'
    fragments = [e["function"]["arguments"] for e in entries if e["index"] == 0]
    assert fragments == ['{"city": "Paris"', ', "days": 3}']
    assert entries[-1]["function"] == {"name": "noop", "arguments": "{}"}
    assert not any(d.content for d in deltas)


@pytest.mark.parametrize(
    ("parser", "reply", "sent", "content"),
    [
        ("pythonic", "[f(x=1, x=2)]", [("f", '{"x": 1')], "x=2)]"),
        ("pythonic", "[f(a=1), g(2)]", [("f", '{"a": 1}')], ", g(2)]"),
        ("pythonic", "[f(x=1)", [("f", '{"x": 1}')], ""),  # cut short (max_tokens)
        ("hermes", '<tool_call>{"name": "f", "arguments": {"a": 1}} x', [("f", '{"a": 1}')], "x"),
    ],
)
def test_stream_keeps_calls_already_sent(parser, reply, sent, content):
    """A reply that turns malformed after a call was streamed: what was sent stands (it cannot be
    taken back) and the rest arrives as content. (`extract` calls such replies content.)"""
    got_content, entries, _ = run_stream(parser, list(reply))
    assert assemble(entries) == sent
    assert got_content == content


@pytest.mark.parametrize(
    ("parser", "prefix", "sent"),
    [
        ("pythonic", "  [get_weather(city=", ""),  # may be a call: held
        ("pythonic", "[Note:", "[Note:"),  # cannot be: released at once
        ("pythonic", "```tool", ""),
        ("pythonic", "Sure", "Sure"),
        ("hermes", "Sure, one moment.\n<tool_", "Sure, one moment."),
        ("hermes", "a <b", "a <b"),
        ("hermes", '<tool_call>\n{"na', ""),
    ],
)
def test_stream_holds_back_only_possible_calls(parser, prefix, sent):
    stream = get_tool_parser(parser).stream()
    assert stream.feed(prefix).content == sent


def test_unknown_parser_names_the_choices():
    with pytest.raises(
        ValueError,
        match=r"--tool-call-parser: unknown parser 'xml' "
        r"\(choose from harmony, hermes, openai, pythonic\)",
    ):
        get_tool_parser("xml")

"""The harmony (gpt-oss) reply parser: reasoning, content and tool calls of whole replies, and the
same from streams cut at every character and in random chunks (a cut inside a marker included),
with no marker text ever sent; text that is not harmony, or harmony gone wrong, is content."""

from __future__ import annotations

import random

import pytest

from inferd.tools import get_tool_parser
from inferd.tools.harmony import MARKERS, HarmonyToolParser, held_back, parse_header

THINK = "<|channel|>analysis<|message|>The user wants the weather.<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>"
CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>'
)
CASES = [
    # (reply, reasoning, content, [(name, arguments)])
    (THINK + FINAL, "The user wants the weather.", "It is sunny.", []),
    (THINK + CALL, "The user wants the weather.", "", [("get_weather", '{"city": "Paris"}')]),
    # stop tokens end generation before they reach the text
    (THINK + FINAL.removesuffix("<|return|>"), "The user wants the weather.", "It is sunny.", []),
    (
        THINK + CALL.removesuffix("<|call|>"),
        "The user wants the weather.",
        "",
        [("get_weather", '{"city": "Paris"}')],
    ),
    # no <|constrain|>; the recipient before the channel, as gpt-oss's template writes it
    ("<|channel|>commentary to=functions.f<|message|>{}<|call|>", "", "", [("f", "{}")]),
    (
        ' to=functions.lookup<|channel|>commentary json<|message|>{"q": "x"}',
        "",
        "",
        [("lookup", '{"q": "x"}')],
    ),
    (
        THINK + "<|start|>assistant to=functions.g<|channel|>commentary <|constrain|>json"
        '<|message|>{"a": [1, 2]}<|call|>',
        "The user wants the weather.",
        "",
        [("g", '{"a": [1, 2]}')],
    ),
    # a commentary message without a recipient (a preamble) is content
    (
        "<|channel|>commentary<|message|>Checking.<|end|>" + CALL,
        "",
        "Checking.",
        [("get_weather", '{"city": "Paris"}')],
    ),
    ("<|channel|>final<|message|>Just an answer.", "", "Just an answer.", []),
    ("<|channel|>analysis<|message|>cut by max_tokens", "cut by max_tokens", "", []),
    # not harmony at all
    (
        "Plain text, no markers: <| not one |> and to= here.",
        "",
        "Plain text, no markers: <| not one |> and to= here.",
        [],
    ),
    ("total: 5", "", "total: 5", []),
    ("", "", "", []),
    # malformed: degrades to content, markers dropped
    ("<|channel|>final", "", "final", []),
    ("<|channel|>final<|end|>after", "", "finalafter", []),
    ("<|channel|>analysis\nnot a header<|message|>x", "", "analysis\nnot a headerx", []),
    ("<|end|><|return|>stray markers<|call|>", "", "stray markers", []),
    ("<|channel|>final<|message|>a<|message|>b<|constrain|>c", "", "abc", []),
    ("<|channel|>commentary to=functions.<|message|>{}", "", "{}", []),  # no function name
    ("<|channel|>final<|message|>ends mid-marker <|ret", "", "ends mid-marker <|ret", []),
    # a message whose `<|start|>assistant` is missing
    ("<|channel|>analysis<|message|>r<|channel|>final<|message|>c", "r", "c", []),
]


def whole(reply: str):
    parsed = get_tool_parser("harmony").parse(reply)
    return parsed.reasoning, parsed.content, [(c.name, c.arguments) for c in parsed.calls]


def streamed(reply: str, chunks: list[str], calls: bool = True):
    stream = HarmonyToolParser(calls).stream()
    reasoning = content = ""
    found: dict[int, list[str]] = {}
    read = 0
    for chunk in [*chunks, None]:
        out = stream.feed(chunk) if chunk is not None else stream.finish()
        read += len(chunk or "")
        for text in (out.reasoning, out.content):  # no marker, nor the start of one to come
            assert not any(m in text for m in MARKERS), text
            tail = text[len(text) - held_back(text) :]
            assert not tail or not any((tail + reply[read:]).startswith(m) for m in MARKERS)
        reasoning += out.reasoning
        content += out.content
        for d in out.tool_calls:
            if d.id is not None:
                assert d.index == len(found) and d.name
                found[d.index] = [d.name, ""]
            found[d.index][1] += d.arguments
    return reasoning, content, [tuple(v) for v in found.values()]


@pytest.mark.parametrize("reply, reasoning, content, calls", CASES)
def test_whole_replies(reply, reasoning, content, calls):
    assert whole(reply) == (reasoning, content, calls)


@pytest.mark.parametrize("reply, reasoning, content, calls", CASES)
def test_streams_in_any_chunking_equal_the_whole_reply(reply, reasoning, content, calls):
    expected = (reasoning, content, calls)
    assert streamed(reply, list(reply)) == expected  # one character at a time
    rng = random.Random(len(reply))
    for _ in range(20 if len(reply) > 1 else 0):
        cuts = sorted(rng.sample(range(1, len(reply)), min(len(reply) - 1, rng.randint(1, 6))))
        chunks = [reply[a:b] for a, b in zip([0, *cuts], [*cuts, len(reply)], strict=True)]
        assert streamed(reply, chunks) == expected, chunks


def test_no_marker_text_is_sent_while_a_marker_arrives():
    stream = HarmonyToolParser().stream()
    sent = []
    for chunk in [
        "<|chan",
        "nel|>analysis<|mes",
        "sage|>Thinking <|e",
        "nd|><|start|>assis",
        "tant<|channel|>final<|message|>Hi<|ret",
        "urn|>",
    ]:
        out = stream.feed(chunk)
        sent.append((out.reasoning, out.content))
    assert sent == [("", ""), ("", ""), ("Thinking ", ""), ("", ""), ("", "Hi"), ("", "")]
    assert not stream.finish()


def test_a_call_is_announced_with_its_header_and_its_arguments_stream():
    stream = HarmonyToolParser().stream()
    first = stream.feed("<|channel|>commentary to=functions.f <|constrain|>json<|message|>")
    [announce] = first.tool_calls
    assert (announce.index, announce.name, announce.arguments) == (0, "f", "")
    assert announce.id.startswith("call_")
    parts = [stream.feed(c).tool_calls for c in ['{"a"', ": 1}", "<|call|>"]]
    assert [[(d.index, d.id, d.arguments) for d in p] for p in parts] == [
        [(0, None, '{"a"')],
        [(0, None, ": 1}")],
        [],
    ]


def test_plain_text_streams_at_once():
    stream = HarmonyToolParser().stream()
    assert stream.feed("Hello").content == "Hello"
    assert stream.feed(" there <").content == " there "  # "<" may begin a marker
    assert stream.feed("b>").content == "<b>"


def test_without_tools_a_call_is_content():
    reply = "<|channel|>commentary to=functions.f<|message|>{}<|call|>"
    parsed = HarmonyToolParser(calls=False).parse(reply)
    assert (parsed.content, parsed.calls) == ("{}", [])
    assert streamed(reply, list(reply), calls=False) == ("", "{}", [])


def test_headers_and_held_back_text():
    assert parse_header("assistant<|channel|>final") == parse_header("<|channel|>final")
    header = parse_header("assistant to=functions.a.b<|channel|>commentary json")
    assert (header.channel, header.recipient, header.function) == (
        "commentary",
        "functions.a.b",
        "a.b",
    )
    assert parse_header("assistant<|channel|>analysis to=browser.search").function is None
    assert [held_back(t) for t in ["abc", "x<", "x<|", "x<|cal", "x<|call|", "<|x", "<|end|>"]] == [
        0,
        1,
        2,
        5,
        7,
        0,
        0,
    ]


def test_garbage_never_raises():
    rng = random.Random(7)
    pieces = [
        "<|start|>",
        "<|channel|>",
        "<|message|>",
        "<|end|>",
        "<|call|>",
        "<|constrain|>",
        "<|return|>",
        "to=functions.f",
        "analysis",
        "final",
        " ",
        "{",
        "\n",
        "<|",
        "x",
    ]
    for _ in range(300):
        reply = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        reasoning, content, calls = whole(reply)
        assert streamed(reply, list(reply)) == (reasoning, content, calls)


@pytest.mark.parametrize("gap", [240, 250, 255, 256, 257, 262, 270, 300])
def test_an_overlong_header_is_content_however_it_arrives(gap):
    reply = "<|channel|>" + "x" * gap + "<|channel|>final<|message|>answer"
    expected = whole(reply)
    assert "<|" not in expected[1] and expected[1].endswith("answer")
    assert streamed(reply, list(reply)) == expected

"""Tool calls written as a Python list of calls: `[get_weather(city="Paris"), f2(x=1)]`.

The format Google documents for Gemma 3 (the model has no tool tokens): a reply that calls tools
is the list and nothing else, keyword arguments only, values Python literals. Gemma sometimes
wraps it in a ```tool_code (or ```python) fence, which is accepted. A reply whose first
non-blank character starts no such list is plain content. Values are read with
`ast.literal_eval`, never evaluated; arguments are sent as the JSON of the keyword arguments.

Streaming holds back only what may still be a call list: "[Note: ..." is released as content as
soon as ':' shows it is not a call. A call is announced with its first complete keyword argument
(or its closing parenthesis), and its arguments grow one keyword argument at a time. If a list
turns out malformed (or is cut short) after a call was sent, what was sent stands and the rest
of the text is sent as content (the whole-reply `extract` calls all of it content).
"""

from __future__ import annotations

from dataclasses import dataclass

from inferd.tools.parser import CallEmitter, PartialCall, ToolCallStream, ToolParser
from inferd.tools.scanning import IDENTIFIER, Invalid, dumps, python_value, skip_ws, value_end
from inferd.tools.types import StreamDelta, ToolCall

_FENCES = ("```tool_code\n", "```python\n", "```\n")
_CLOSE_FENCE = "```"


@dataclass
class _Opening:
    kind: str  # "wait" (undecided), "content", or "list"
    start: int = 0  # the "[" when kind == "list"
    fenced: bool = False


def _opening(text: str) -> _Opening:
    i = skip_ws(text, 0)
    rest = text[i:]
    if not rest:
        return _Opening("wait")
    if rest[0] == "[":
        return _Opening("list", i)
    for fence in _FENCES:
        if rest.startswith(fence):
            j = skip_ws(text, i + len(fence))
            if j == len(text):
                return _Opening("wait")
            return _Opening("list", j, True) if text[j] == "[" else _Opening("content")
        if fence.startswith(rest):
            return _Opening("wait")
    return _Opening("content")


@dataclass
class _ListScan:
    calls: list[PartialCall]
    consumed: int  # just past the last call, or argument, that can be sent
    end: int | None  # just past "]" once the list is complete


def _scan_list(text: str, start: int) -> _ListScan:
    """The calls of the list opening at text[start] == "[", as far as the text goes."""
    calls: list[PartialCall] = []
    i = start + 1
    consumed = i
    while True:
        i = skip_ws(text, i)
        if i == len(text):
            return _ListScan(calls, consumed, None)
        if text[i] == "]" and calls:
            return _ListScan(calls, consumed, i + 1)
        name = IDENTIFIER.match(text, i)
        if name is None:
            raise Invalid(f"a function name is expected at {i}")
        i = skip_ws(text, name.end())
        if i == len(text):
            return _ListScan(calls, consumed, None)  # the name may go on
        if text[i] != "(":
            raise Invalid(f"'(' is expected after {name.group()!r}")
        arguments, i, closed, last = _scan_arguments(text, i + 1)
        prefix = dumps(arguments)
        # Announced once an argument (or the closing parenthesis) shows the call is well formed.
        known = name.group() if closed or arguments else None
        calls.append(PartialCall(known, prefix if closed else prefix[:-1], closed))
        if not closed:
            return _ListScan(calls, last if arguments else consumed, None)
        consumed = i
        i = skip_ws(text, i)
        if i == len(text):
            return _ListScan(calls, consumed, None)
        if text[i] == "]":
            return _ListScan(calls, consumed, i + 1)
        if text[i] != ",":
            raise Invalid(f"',' or ']' is expected at {i}")
        i += 1


def _scan_arguments(text: str, i: int) -> tuple[dict, int, bool, int]:
    """Keyword arguments after "(": (the complete ones, position, whether ')' was reached,
    the position just past the last complete one)."""
    arguments: dict = {}
    last = i
    while True:
        i = skip_ws(text, i)
        if i == len(text):
            return arguments, i, False, last
        if text[i] == ")":
            return arguments, i + 1, True, i + 1
        key = IDENTIFIER.match(text, i)
        if key is None:
            raise Invalid(f"a keyword argument is expected at {i}")
        i = skip_ws(text, key.end())
        if i == len(text):
            return arguments, i, False, last
        if text[i] != "=":
            raise Invalid(f"'=' is expected after {key.group()!r} (arguments need names)")
        if key.group() in arguments:
            raise Invalid(f"keyword argument {key.group()!r} repeated")
        end = value_end(text, i + 1, ",)", python=True)
        if end is None:
            return arguments, len(text), False, last
        arguments[key.group()] = python_value(text[i + 1 : end])
        i = last = end + 1 if text[end] == "," else end


def _after_list(text: str, end: int, fenced: bool) -> int | None:
    """Where the content after a complete list starts (past a closing fence and blanks), or
    None while that is undecided."""
    i = skip_ws(text, end)
    if fenced:
        if text.startswith(_CLOSE_FENCE, i):
            i = skip_ws(text, i + len(_CLOSE_FENCE))
        elif _CLOSE_FENCE.startswith(text[i:]):
            return None
    return i


class PythonicToolParser(ToolParser):
    name = "pythonic"
    template = "gemma_tools.jinja"

    def extract(self, text: str) -> tuple[str, list[ToolCall]]:
        opening = _opening(text)
        if opening.kind != "list":
            return text, []
        try:
            scan = _scan_list(text, opening.start)
        except Invalid:
            return text, []
        if scan.end is None:
            return text, []
        tail = _after_list(text, scan.end, opening.fenced)
        content = "" if tail is None else text[tail:]
        return content, [ToolCall(c.name, c.arguments) for c in scan.calls]

    def stream(self) -> ToolCallStream:
        return _PythonicStream()


class _PythonicStream(ToolCallStream):
    def __init__(self) -> None:
        self._text = ""
        self._mode = "wait"  # wait -> content | list -> tail -> content
        self._sent = 0  # content sent up to here (content mode)
        self._opening = _Opening("wait")
        self._end = 0  # just past the list (tail mode)
        self._consumed = 0
        self._emitter = CallEmitter()

    def _advance(self, final: bool) -> StreamDelta:
        out = StreamDelta()
        if self._mode == "wait":
            self._opening = _opening(self._text)
            if self._opening.kind == "wait" and not final:
                return out
            self._mode = "list" if self._opening.kind == "list" else "content"
        if self._mode == "list":
            self._scan(out, final)
        if self._mode == "tail":
            start = _after_list(self._text, self._end, self._opening.fenced)
            if start is None and final:
                start = len(self._text)
            if start is not None and start < len(self._text):
                self._mode, self._sent = "content", start
        if self._mode == "content":
            out.content += self._text[self._sent :]
            self._sent = len(self._text)
        return out

    def _scan(self, out: StreamDelta, final: bool) -> None:
        try:
            scan = _scan_list(self._text, self._opening.start)
        except Invalid:
            # Nothing sent yet: the whole reply is content. Else the calls sent stand.
            self._mode = "content"
            self._sent = 0 if self._emitter.announced == 0 else skip_ws(self._text, self._consumed)
            return
        self._consumed = scan.consumed
        out.tool_calls += self._emitter.deltas(scan.calls)
        if scan.end is not None:
            self._mode, self._end = "tail", scan.end
        elif final and self._emitter.announced == 0:
            self._mode, self._sent = "content", 0  # an unfinished list that named no call

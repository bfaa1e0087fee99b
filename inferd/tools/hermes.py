"""Tool calls in Hermes / ChatML style: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

The format of ChatML models trained for tools (Qwen 2.5, Hermes; SmolLM2 with the bundled
template). A reply may hold content, then one or more tagged calls; blanks next to the tags are
layout, not content. "parameters" is accepted for "arguments", a missing "arguments" means {},
and a missing closing tag at the very end of the reply is tolerated. A block whose body is not
such an object is passed on as content, tags and all.

Streaming holds back only a possible `<tool_call>` prefix (and the blanks before it). A call is
announced once its name has been read and its arguments have begun as an object; they grow one
complete top-level member at a time, re-serialised, so streamed and whole-reply arguments are
the same text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferd.tools.parser import CallEmitter, PartialCall, ToolCallStream, ToolParser
from inferd.tools.scanning import Invalid, dumps, json_value, skip_ws, string_end, value_end
from inferd.tools.types import StreamDelta, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_ARGUMENT_KEYS = ("arguments", "parameters")


@dataclass
class _Members:
    values: dict = field(default_factory=dict)  # complete members
    end: int | None = None  # just past "}" once closed
    pending_key: str | None = None  # the member whose value is still arriving
    pending_start: int = 0


def _scan_object(text: str, i: int) -> _Members:
    """The members of the JSON object opening at text[i] == "{", as far as the text goes."""
    members = _Members()
    i += 1
    while True:
        i = skip_ws(text, i)
        if i == len(text):
            return members
        if text[i] == "}":
            members.end = i + 1
            return members
        if text[i] != '"':
            raise Invalid(f"a member name is expected at {i}")
        key_end = string_end(text, i, python=False)
        if key_end is None:
            return members
        key = json_value(text[i:key_end])
        i = skip_ws(text, key_end)
        if i == len(text):
            return members
        if text[i] != ":":
            raise Invalid(f"':' is expected after {key!r}")
        if key in members.values:
            raise Invalid(f"member {key!r} repeated")
        start = skip_ws(text, i + 1)
        end = value_end(text, start, ",}", python=False)
        if end is None:
            members.pending_key, members.pending_start = key, start
            return members
        members.values[key] = json_value(text[start:end])
        i = end + 1 if text[end] == "," else end


def _scan_call(body: str) -> tuple[PartialCall, int | None]:
    """The call in a tag's body so far, and where its object ends in `body` once closed."""
    i = skip_ws(body, 0)
    if i == len(body):
        return PartialCall(None, "", False), None
    if body[i] != "{":
        raise Invalid("a tool call must be a JSON object")
    members = _scan_object(body, i)
    name = members.values.get("name")
    if name is not None and not isinstance(name, str):
        raise Invalid("the tool call's name must be a string")
    key = next((k for k in _ARGUMENT_KEYS if k in members.values), None)
    if key is not None:
        if not isinstance(members.values[key], dict):
            raise Invalid("the tool call's arguments must be an object")
        arguments = dumps(members.values[key])
    elif members.pending_key in _ARGUMENT_KEYS and body.startswith("{", members.pending_start):
        partial = _scan_object(body, members.pending_start)
        arguments = dumps(partial.values)[:-1]
    elif members.end is not None:
        arguments = "{}"
    else:
        arguments = ""
    if members.end is not None and name is None:
        raise Invalid("the tool call has no name")
    # Announced once the arguments have begun as an object (or the call is complete).
    known = name if arguments or members.end is not None else None
    return PartialCall(known, arguments, members.end is not None), members.end


class HermesToolParser(ToolParser):
    name = "hermes"
    template = "chatml_tools.jinja"

    def extract(self, text: str) -> tuple[str, list[ToolCall]]:
        stream = _HermesStream()
        content = stream.feed(text).content + stream.finish().content
        return content, [ToolCall(c.name, c.arguments) for c in stream.calls]

    def stream(self) -> ToolCallStream:
        return _HermesStream()


class _HermesStream(ToolCallStream):
    def __init__(self) -> None:
        self._text = ""
        self._pos = 0  # everything before is dealt with
        self._inside = False  # between an opening tag and its end
        self._block = 0  # where the current block's opening tag starts
        self._after_call = False  # blanks right after a call's closing tag are layout
        self.calls: list[PartialCall] = []  # the calls so far (complete ones, but see below)
        self._current = PartialCall(None, "", False)  # the block's call as last scanned
        self._emitter = CallEmitter()

    def _advance(self, final: bool) -> StreamDelta:
        out = StreamDelta()
        while True:
            if not self._inside:
                self._outside(out, final)
                if not self._inside:
                    return out
            if not self._in_block(out, final):
                return out

    def _outside(self, out: StreamDelta, final: bool) -> None:
        text = self._text
        if self._after_call:
            start = skip_ws(text, self._pos)
            if start == len(text):
                self._pos = len(text) if final else self._pos
                return
            self._pos, self._after_call = start, False
        tag = text.find(OPEN, self._pos)
        if tag >= 0:
            out.content += text[self._pos : tag].rstrip()
            self._inside, self._block, self._pos = True, tag, tag + len(OPEN)
            return
        end = len(text)
        if not final:
            # Hold back what may begin a tag, and the blanks before it.
            end -= next((k for k in range(len(OPEN) - 1, 0, -1) if text.endswith(OPEN[:k])), 0)
            end = max(end, self._pos)
            while end > self._pos and text[end - 1].isspace():
                end -= 1
        out.content += text[self._pos : end]
        self._pos = end

    def _in_block(self, out: StreamDelta, final: bool) -> bool:
        """Advance inside a block; True when the block is over (continue outside)."""
        text = self._text
        close = text.find(CLOSE, self._pos)
        body = text[self._pos : close if close >= 0 else len(text)]
        index = len(self.calls)
        try:
            call, object_end = _scan_call(body)
        except Invalid:
            call, object_end = None, None
        if call is not None:
            out.tool_calls += self._emitter.deltas([*self.calls, call])
            self._current = call
        if call is not None and call.complete:
            rest = body[object_end:].strip()
            # Text after the object that is not the closing tag: the call ends at its object.
            stray = bool(rest) and (close >= 0 or not CLOSE.startswith(rest))
            if not (close >= 0 or final or stray):
                return False  # wait for the closing tag
            self.calls.append(call)
            self._inside, self._after_call = False, True
            if stray:
                self._pos += object_end
            else:
                self._pos = close + len(CLOSE) if close >= 0 else len(text)
            return True
        if call is not None and close < 0 and not final:
            return False  # still arriving
        end = close + len(CLOSE) if close >= 0 else len(text)
        if self._emitter.announced > index:
            # Its start was sent and cannot be taken back: the call stands as sent.
            self.calls.append(self._current)
        else:
            out.content += text[self._block : end]  # not a call: content, tags and all
        self._inside, self._pos = False, end
        return True

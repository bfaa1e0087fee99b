"""Replies in OpenAI's harmony format (gpt-oss): reasoning, the answer and tool calls, each a
message on a channel of its own.

    <|channel|>analysis<|message|>REASONING<|end|>
    <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>
    <|start|>assistant<|channel|>commentary to=functions.F <|constrain|>json<|message|>{}<|call|>

gpt-oss's generation prompt ends with `<|start|>assistant`, so a reply begins inside its first
message's header. A header runs to `<|message|>` and names the channel (`analysis`: reasoning;
`final`, `commentary` or none: content) and maybe a recipient, before or after `<|channel|>`:
`to=functions.NAME` makes the message a call of NAME whose body is the arguments' JSON text
(passed on as written). A body ends at `<|end|>`, `<|return|>` or `<|call|>`; the last two are
stop tokens, so they normally end generation before reaching the text.

The markers are special tokens: the chat pipeline decodes harmony replies with them
(skip_special_tokens false), and this parser drops every one, so none is ever content. Text that
is not harmony (no markers) is content; so is a header that is not one (it never reaches
`<|message|>`, runs over a line or too long), its markers dropped. A stream holds back only a
possible marker prefix at the end of its text, and a header until it is complete.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from inferd.tools.parser import ToolCallStream, ToolParser
from inferd.tools.types import ParsedReply, StreamDelta, ToolCall, ToolCallDelta, new_call_id

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, RETURN, CALL = "<|end|>", "<|return|>", "<|call|>"
MARKERS = (START, CHANNEL, MESSAGE, CONSTRAIN, END, RETURN, CALL)
_IN_HEADER = (CHANNEL, CONSTRAIN)  # markers a header holds; any other one ends it
_MAX_HEADER = 256  # characters: real headers are a few words
_LONGEST = max(map(len, MARKERS))
_FUNCTIONS = "functions."
_FIRST, _OUTSIDE, _HEADER, _BODY = range(4)


@dataclass(frozen=True)
class Header:
    channel: str | None
    recipient: str | None

    @property
    def function(self) -> str | None:
        """The function a message calls (recipient `functions.NAME`), or None."""
        name = (self.recipient or "").removeprefix(_FUNCTIONS)
        return name if name and self.recipient != name else None


def parse_header(text: str) -> Header:
    """A header's channel and recipient; `text` runs from after the role's `<|start|>` (or the
    reply's start) to `<|message|>`, e.g. "assistant to=functions.f<|channel|>commentary json"."""
    role, _, rest = text.partition(CHANNEL)
    channel_words = rest.partition(CONSTRAIN)[0].split()
    words = role.split() + channel_words
    recipient = next((w[3:] for w in words if w.startswith("to=")), None)
    channel = next((w for w in channel_words if not w.startswith("to=")), None)
    return Header(channel, recipient)


def find_marker(text: str, start: int = 0) -> tuple[int, str | None]:
    """The first marker at or after `start`: (index, marker), or (-1, None)."""
    i = text.find("<|", start)
    while i >= 0:
        marker = next((m for m in MARKERS if text.startswith(m, i)), None)
        if marker is not None:
            return i, marker
        i = text.find("<|", i + 1)
    return -1, None


def held_back(text: str) -> int:
    """How many characters at the end of `text` may be the start of a marker."""
    # NOTE: a marker holds one "<", at its start: only the last "<" can begin one.
    i = text.rfind("<", max(0, len(text) - _LONGEST + 1))
    tail = text[i:] if i >= 0 else ""
    return len(tail) if tail and any(m.startswith(tail) and m != tail for m in MARKERS) else 0


def _not_a_header(text: str, end: int) -> int:
    """Where the header in text[:end] proves to be none (a line break; too long), or -1. The
    same point whether the text arrives whole or in pieces: a stream's `end` leaves out a
    possible marker prefix, and the length cut waits until a marker across it is complete."""
    newline = text.find("\n", 0, end)
    if newline >= 0:
        return newline
    if end <= _MAX_HEADER + _LONGEST:
        return -1
    j = text.rfind("<|", 0, _MAX_HEADER)
    across = j >= 0 and any(text.startswith(m, j) and j + len(m) > _MAX_HEADER for m in MARKERS)
    return j if across else _MAX_HEADER


def _visible(header: str) -> str:
    for marker in _IN_HEADER:
        header = header.replace(marker, "")
    return header


class HarmonyToolParser(ToolParser):
    name = "harmony"
    template = ""  # gpt-oss's own template shows tools; inferd bundles none
    channels = True

    def __init__(self, calls: bool = True) -> None:
        self.calls = calls  # False: a call's body is content (the request offered no tools)

    def parse(self, text: str) -> ParsedReply:
        stream = HarmonyStream(self.calls)
        out = stream.feed(text)
        rest = stream.finish()
        calls = [ToolCall(name, arguments, call_id) for call_id, name, arguments in stream.calls]
        return ParsedReply(out.content + rest.content, calls, out.reasoning + rest.reasoning)

    def extract(self, text: str) -> tuple[str, list[ToolCall]]:
        parsed = self.parse(text)
        return parsed.content, parsed.calls

    def stream(self) -> ToolCallStream:
        return HarmonyStream(self.calls)


class HarmonyStream(ToolCallStream):
    """One reply, read as it arrives. Only the text not dealt with yet is kept (`_text`), so a
    long reasoning costs time in proportion to its length."""

    def __init__(self, calls: bool = True) -> None:
        self._calls_allowed = calls
        self._text = ""
        self._state = _FIRST
        self._to: str | int = "content"  # a body's destination: reasoning, content, call index
        self.calls: list[list[str]] = []  # [id, name, arguments] of each call so far

    def _advance(self, final: bool) -> StreamDelta:
        out = StreamDelta()
        step = {_FIRST: self._first, _OUTSIDE: self._outside, _HEADER: self._header,
                _BODY: self._body}  # fmt: skip
        while step[self._state](out, final):
            pass
        return out

    def _first(self, out: StreamDelta, final: bool) -> bool:
        """The reply's start: a header (the template wrote `<|start|>assistant`), or text that
        is not harmony at all. True: the state changed."""
        start = self._text.lstrip()
        if start.startswith(("<|", "to=")):
            self._state = _HEADER
        elif start and not final and ("<|".startswith(start) or "to=".startswith(start)):
            return False  # too short to tell
        elif start or final:
            self._state = _OUTSIDE
        else:
            return False
        return True

    def _outside(self, out: StreamDelta, final: bool) -> bool:
        """Between messages: stray text is content, stray markers are dropped."""
        i, marker = find_marker(self._text)
        if marker is None:
            keep = 0 if final else held_back(self._text)
            out.content += self._text[: len(self._text) - keep]
            self._text = self._text[len(self._text) - keep :]
            return False
        out.content += self._text[:i]
        # `<|channel|>` stays: the header reads it (a message whose `<|start|>role` is missing).
        self._text = self._text[i if marker == CHANNEL else i + len(marker) :]
        if marker in (START, CHANNEL):
            self._state = _HEADER
        return True

    def _header(self, out: StreamDelta, final: bool) -> bool:
        text = self._text
        i, marker = find_marker(text)
        while marker in _IN_HEADER:
            i, marker = find_marker(text, i + len(marker))
        end = i if marker is not None else len(text) - (0 if final else held_back(text))
        cut = _not_a_header(text, end)
        if cut < 0 and marker == MESSAGE:
            self._open(out, parse_header(text[:i]))
            self._text, self._state = text[i + len(MESSAGE) :], _BODY
            return True
        if cut < 0 and (marker is not None or final):
            cut = end  # cut short by another message or an end, or the reply's end
        if cut < 0:
            return False  # still arriving
        out.content += _visible(text[:cut])
        self._text, self._state = text[cut:], _OUTSIDE
        return True

    def _open(self, out: StreamDelta, header: Header) -> None:
        name = header.function
        if name is not None and self._calls_allowed:
            self._to = len(self.calls)
            self.calls.append([new_call_id(), name, ""])
            out.tool_calls.append(ToolCallDelta(self._to, self.calls[-1][0], name, ""))
        else:
            self._to = "reasoning" if header.channel == "analysis" else "content"

    def _body(self, out: StreamDelta, final: bool) -> bool:
        i, marker = find_marker(self._text)
        if marker is None:
            keep = 0 if final else held_back(self._text)
            self._send(out, self._text[: len(self._text) - keep])
            self._text = self._text[len(self._text) - keep :]
            return False  # at the end, a call cut short stands as sent
        self._send(out, self._text[:i])
        if marker in (MESSAGE, CONSTRAIN):  # stray inside a body: dropped
            self._text = self._text[i + len(marker) :]
            return True
        self._text = self._text[i if marker == CHANNEL else i + len(marker) :]
        self._state = _HEADER if marker in (START, CHANNEL) else _OUTSIDE
        return True

    def _send(self, out: StreamDelta, text: str) -> None:
        if not text:
            return
        if self._to == "reasoning":
            out.reasoning += text
        elif self._to == "content":
            out.content += text
        else:
            index = int(self._to)
            self.calls[index][2] += text
            last = out.tool_calls[-1] if out.tool_calls else None
            if last is not None and last.index == index:  # one fragment per delta and call
                out.tool_calls[-1] = dataclasses.replace(last, arguments=last.arguments + text)
            else:
                out.tool_calls.append(ToolCallDelta(index, arguments=text))

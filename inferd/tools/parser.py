"""The tool-call parser interface, and turning snapshots of half-parsed calls into stream deltas.

A parser reads a model's reply in the model's own call format. `extract(text)` parses a whole
reply; `stream()` returns a per-request object fed the reply's text deltas, which answers each
with content to send now and `tool_calls` fragments, holding back text that may yet turn out to
be (the start of) a call.

Both parsers stream the same way: after each delta they re-scan the reply so far into a list of
`PartialCall`s (name once known, and a prefix of the final arguments JSON that can only grow),
and `CallEmitter` sends what is new. Re-scanning keeps the state trivial; replies are short.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from inferd.tools.types import ParsedReply, StreamDelta, ToolCall, ToolCallDelta, new_call_id


@dataclass(frozen=True)
class PartialCall:
    name: str | None  # None until the whole name has been read
    arguments: str  # a prefix of the arguments' final JSON text; all of it once complete
    complete: bool


class CallEmitter:
    """Sends each call's announcement once (index, id, name) and then its argument text as the
    prefix grows."""

    def __init__(self) -> None:
        self._ids: list[str] = []
        self._sent: list[str] = []

    @property
    def announced(self) -> int:
        return len(self._ids)

    def deltas(self, calls: list[PartialCall]) -> list[ToolCallDelta]:
        out = []
        for index, call in enumerate(calls):
            if call.name is None:
                break  # calls are announced in order
            if index == len(self._ids):
                self._ids.append(new_call_id())
                self._sent.append(call.arguments)
                out.append(ToolCallDelta(index, self._ids[index], call.name, call.arguments))
                continue
            sent = self._sent[index]
            if call.arguments != sent:
                # NOTE: scanners only report argument text that cannot change any more.
                assert call.arguments.startswith(sent), (sent, call.arguments)
                out.append(ToolCallDelta(index, arguments=call.arguments[len(sent) :]))
                self._sent[index] = call.arguments
        return out


class ToolCallStream(ABC):
    """One streamed reply. Feed every text delta, then call `finish()` once. Each format keeps
    the text it has not dealt with yet in `_text` and reads on from it in `_advance`."""

    _text: str

    def feed(self, delta: str) -> StreamDelta:
        self._text += delta
        return self._advance(final=False)

    def finish(self) -> StreamDelta:
        """The end of the reply: releases any text still held back."""
        return self._advance(final=True)

    @abstractmethod
    def _advance(self, final: bool) -> StreamDelta:
        """What the text kept so far lets the stream send (`final`: no more text comes)."""


class ToolParser(ABC):
    name: ClassVar[str]
    # The chat template (in inferd/templates/) that presents tools in this parser's format.
    template: ClassVar[str]
    # The format has channels (reasoning, answer, calls) marked by special tokens: every reply
    # is read by the parser (its content is never the raw text), decoded with those tokens.
    channels: ClassVar[bool] = False

    @abstractmethod
    def extract(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content, calls) of a whole reply; content is "" when the reply holds only calls,
        and the whole text when it holds none."""

    def parse(self, text: str) -> ParsedReply:
        """A whole reply's content, calls and reasoning (none, for formats without channels)."""
        return ParsedReply(*self.extract(text))

    @abstractmethod
    def stream(self) -> ToolCallStream: ...

"""Tool calls as the OpenAI API shapes them: whole calls in a reply's `message.tool_calls`, and
the fragments a stream sends in `delta.tool_calls`.

A stream announces each call once (index, id, type, function name, arguments "" or a first
fragment), then sends argument fragments for that index; concatenated, the fragments are the JSON
text of the arguments object.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any


def new_call_id() -> str:
    """An id in OpenAI's style ("call_" and 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # the JSON text of the arguments object
    id: str = field(default_factory=new_call_id)

    def to_openai(self) -> dict[str, Any]:
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": function}


@dataclass(frozen=True)
class ToolCallDelta:
    """One entry of a chunk's `delta.tool_calls`. The first delta of a call carries its id and
    name; later ones carry only argument text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index}
        function: dict[str, Any] = {"arguments": self.arguments}
        if self.id is not None:
            out["id"] = self.id
            out["type"] = "function"
        if self.name is not None:
            function = {"name": self.name, **function}
        out["function"] = function
        return out


@dataclass
class StreamDelta:
    """What one step of a stream adds: text for `delta.content`, entries for
    `delta.tool_calls` and reasoning text (any may be empty; reasoning only from parsers of
    formats with channels, e.g. harmony)."""

    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)
    reasoning: str = ""

    def __bool__(self) -> bool:
        return bool(self.content or self.tool_calls or self.reasoning)


@dataclass
class ParsedReply:
    """A whole reply read by a parser: content, tool calls and reasoning."""

    content: str
    calls: list[ToolCall]
    reasoning: str = ""

"""Replies in Anthropic's Messages API shapes: the message object (thinking, text and tool_use
content blocks, stop_reason, usage), its stream events, and its errors.

A model's reasoning (harmony's analysis channel) is a `thinking` block before the text, its
`signature` empty: nothing here signs it, and the server reads thinking sent back unsigned.
A stream is `message_start` (the message, empty), then per content block `content_block_start`,
`content_block_delta`s (`thinking_delta`, `text_delta`, or `input_json_delta` for a tool_use
block's input) and
`content_block_stop`, then `message_delta` (stop_reason, stop_sequence, usage) and
`message_stop`; each on an `event:` line named as its `type`, as `anthropic.types` and the
SDK's `client.messages.stream()` helper read them. A failure after the start is an `error`
event with an Anthropic error object.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from inferd.outputs import RequestOutput
from inferd.server.generation.chat_pipeline import Reply
from inferd.server.http.errors import anthropic_error_body
from inferd.server.http.sse import encode_named_event
from inferd.tools import ToolCall


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def stop_reason(
    finish_reason: str | None,
    stop: int | str | None,
    called: bool,
    stop_sequences: list[str] | None,
) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) from the engine's finish."""
    if called:
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if isinstance(stop, str) and stop in (stop_sequences or []):
        return "stop_sequence", stop
    return "end_turn", None


def usage_json(out: RequestOutput, generated: int | None = None) -> dict[str, Any]:
    """`generated`: the reply's tokens, where `out` is a stream's last (delta) output."""
    return {
        "input_tokens": len(out.prompt_token_ids),
        "output_tokens": len(out.outputs[0].token_ids) if generated is None else generated,
        "cache_read_input_tokens": out.num_cached_tokens,  # served from the prefix cache
        "cache_creation_input_tokens": 0,
    }


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as a tool_use input object. Harmony calls pass the model's own text on,
    which may not be a JSON object: it then stays readable as {"arguments": text}."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"arguments": arguments}


def tool_use_block(call: ToolCall) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": call.id,
        "name": call.name,
        "input": tool_input(call.arguments),
    }


def thinking_block(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": ""}


def message_json(mid: str, model: str, reply: Reply, stop_sequences: list[str] | None) -> dict:
    content = [thinking_block(reply.reasoning)] if reply.reasoning else []
    content += [{"type": "text", "text": reply.content}] if reply.content else []
    content += [tool_use_block(c) for c in reply.calls]
    reason, sequence = stop_reason(
        reply.finish_reason, reply.stop_reason, bool(reply.calls), stop_sequences
    )
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_json(reply.output),
    }


class MessageEvents:
    """The events of one streamed message."""

    def __init__(self, mid: str, model: str, stop_sequences: list[str] | None):
        self.mid, self.model, self.stop_sequences = mid, model, stop_sequences
        self.blocks = 0  # content blocks started
        self.open: str | None = None  # the open block's kind: "thinking", "text", "tool_use"
        self.calls: dict[int, int] = {}  # tool-call index → its block index
        self.called = False

    @staticmethod
    def event(kind: str, **fields: Any) -> bytes:
        return encode_named_event(kind, {"type": kind, **fields})

    def opening(self, prompt_tokens: int) -> list[bytes]:
        message = {
            "id": self.mid,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 0},
        }
        return [self.event("message_start", message=message)]

    def _start(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        events = self._stop()
        self.open, self.blocks = kind, self.blocks + 1
        return events + [
            self.event("content_block_start", index=self.blocks - 1, content_block=block)
        ]

    def _stop(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [self.event("content_block_stop", index=self.blocks - 1)]

    def thinking(self, text: str) -> list[bytes]:
        if not text:
            return []
        events = [] if self.open == "thinking" else self._start("thinking", thinking_block(""))
        delta = {"type": "thinking_delta", "thinking": text}
        return events + [self.event("content_block_delta", index=self.blocks - 1, delta=delta)]

    def text(self, text: str) -> list[bytes]:
        if not text:
            return []
        events = [] if self.open == "text" else self._start("text", {"type": "text", "text": ""})
        delta = {"type": "text_delta", "text": text}
        return events + [self.event("content_block_delta", index=self.blocks - 1, delta=delta)]

    def call(
        self, index: int, call_id: str | None, name: str | None, arguments: str
    ) -> list[bytes]:
        events = []
        if call_id is not None:  # the first fragment of a call: a new tool_use block
            self.called = True
            block = {"type": "tool_use", "id": call_id, "name": name or "", "input": {}}
            events = self._start("tool_use", block)
            self.calls[index] = self.blocks - 1
        if not arguments:
            return events
        delta = {"type": "input_json_delta", "partial_json": arguments}
        return events + [self.event("content_block_delta", index=self.calls[index], delta=delta)]

    def closing(
        self, finish_reason: str | None, stop: int | str | None, out: RequestOutput, generated: int
    ) -> list[bytes]:
        """The last events (`out`: the last delta output; `generated`: the reply's tokens)."""
        reason, sequence = stop_reason(finish_reason, stop, self.called, self.stop_sequences)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        return self._stop() + [
            self.event("message_delta", delta=delta, usage=usage_json(out, generated)),
            self.event("message_stop"),
        ]

    def failed(self, status: int, message: str) -> list[bytes]:
        return [encode_named_event("error", anthropic_error_body(status, message))]

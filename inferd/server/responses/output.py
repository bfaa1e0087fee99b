"""Replies in the Responses API's shapes: the response object, its output items (a `message`
with `output_text`, `function_call`s), and the typed events of a stream.

A stream opens with `response.created` and `response.in_progress`; each output item is opened
(`response.output_item.added`, for a message also `response.content_part.added`), grows
(`response.output_text.delta`, `response.function_call_arguments.delta`) and is closed
(`...done` events), one item after the other; `response.completed` (or `response.incomplete`
when `max_output_tokens` cut the reply) carries the whole response last. Every event has a
`sequence_number`, counting from 0. The names and fields are those of `openai.types.responses`,
whose `client.responses.stream()` helper consumes the stream.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from inferd.outputs import RequestOutput
from inferd.sampling_params import SamplingParams
from inferd.server.http.sse import encode_named_event
from inferd.server.responses.request import ResponsesRequest
from inferd.tools import ToolCall


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage_json(out: RequestOutput, generated: int | None = None) -> dict[str, Any]:
    """`generated`: the reply's tokens, where `out` is a stream's last (delta) output."""
    prompt = len(out.prompt_token_ids)
    generated = len(out.outputs[0].token_ids) if generated is None else generated
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": out.num_cached_tokens, "cache_write_tokens": 0},
        "output_tokens": generated,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + generated,
    }


def text_part(text: str, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


@dataclass
class Item:
    """One output item: a message (its text) or a function call (its arguments)."""

    kind: str  # "message" or "function_call"
    id: str
    text: str = ""  # the message's text, or the call's arguments
    call_id: str = ""
    name: str = ""
    logprobs: list[dict[str, Any]] = field(default_factory=list)

    def json(self, status: str) -> dict[str, Any]:
        if self.kind == "message":
            return {
                "type": "message",
                "id": self.id,
                "status": status,
                "role": "assistant",
                "content": [text_part(self.text, self.logprobs)],
            }
        return {
            "type": "function_call",
            "id": self.id,
            "call_id": self.call_id,
            "name": self.name,
            "arguments": self.text,
            "status": status,
        }


def items_of(content: str, calls: list[ToolCall], logprobs: list[dict[str, Any]]) -> list[Item]:
    """A whole reply's items: its text (if any, or if there is nothing else), then its calls."""
    items = [Item("message", item_id("msg"), content, logprobs=logprobs)]
    if calls and not content:
        items = []
    calls_items = [Item("function_call", item_id("fc"), c.arguments, c.id, c.name) for c in calls]
    return items + calls_items


def as_chat_message(items: list[Item]) -> dict[str, Any]:
    """The reply as a chat assistant message, for the conversation a stored response continues."""
    text = "".join(i.text for i in items if i.kind == "message")
    calls = [
        {"id": i.call_id, "type": "function", "function": {"name": i.name, "arguments": i.text}}
        for i in items
        if i.kind == "function_call"
    ]
    return {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}


class ResponseShape:
    """The response object's fields, and its status from how the reply finished."""

    def __init__(self, body: ResponsesRequest, model: str, params: SamplingParams, store: bool):
        self.body, self.model, self.params, self.store = body, model, params, store
        self.id = item_id("resp")
        self.created_at = int(time.time())

    @staticmethod
    def status_of(finish_reason: str | None) -> tuple[str, dict[str, Any] | None]:
        if finish_reason == "length":
            return "incomplete", {"reason": "max_output_tokens"}
        return "completed", None

    def json(
        self,
        status: str,
        items: list[Item],
        out: RequestOutput | None = None,
        incomplete: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        generated: int | None = None,
    ) -> dict[str, Any]:
        """`generated`: the reply's tokens, where `out` is a stream's last (delta) output."""
        body = self.body
        item_status = "incomplete" if status == "incomplete" else "completed"
        text = {"format": (body.text or {}).get("format") or {"type": "text"}}
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": self.model,
            "output": [i.json(item_status) for i in items] if status != "in_progress" else [],
            "parallel_tool_calls": body.parallel_tool_calls,
            "previous_response_id": body.previous_response_id,
            "store": self.store,
            "temperature": self.params.temperature,
            "text": text,
            "tool_choice": body.tool_choice or ("auto" if body.tools else "none"),
            "tools": body.tools or [],
            "top_logprobs": body.top_logprobs,
            "top_p": self.params.top_p,
            "truncation": "disabled",
            "usage": usage_json(out, generated) if out is not None else None,
            "user": body.user,
            "metadata": body.metadata or {},
            "background": False,
        }


class EventStream:
    """The typed events of one streamed response."""

    def __init__(self, shape: ResponseShape):
        self.shape = shape
        self.items: list[Item] = []
        self.calls: dict[int, Item] = {}  # tool-call index → its item
        self.open: Item | None = None
        self.sequence = 0
        self.pending: list[dict[str, Any]] = []  # logprobs of text the tool parser holds back
        self.response: dict[str, Any] | None = None  # the whole response, once closed

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return encode_named_event(kind, payload)

    def opening(self) -> list[bytes]:
        response = self.shape.json("in_progress", [])
        return [
            self.event("response.created", response=response),
            self.event("response.in_progress", response=response),
        ]

    def _where(self, item: Item) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": self.items.index(item)}

    def _start(self, item: Item) -> list[bytes]:
        events = self._close()
        self.items.append(item)
        self.open = item
        index = len(self.items) - 1
        added = item.json("in_progress")
        if item.kind == "message":
            added["content"] = []
        events.append(self.event("response.output_item.added", output_index=index, item=added))
        if item.kind == "message":
            events.append(
                self.event(
                    "response.content_part.added",
                    **self._where(item),
                    content_index=0,
                    part=text_part("", []),
                )
            )
        return events

    def _close(self, status: str = "completed") -> list[bytes]:
        item, self.open = self.open, None
        if item is None:
            return []
        where = self._where(item)
        if item.kind == "message":
            part = text_part(item.text, item.logprobs)
            events = [
                self.event(
                    "response.output_text.done",
                    **where,
                    content_index=0,
                    text=item.text,
                    logprobs=item.logprobs,
                ),
                self.event("response.content_part.done", **where, content_index=0, part=part),
            ]
        else:
            events = [
                self.event("response.function_call_arguments.done", **where, arguments=item.text)
            ]
        index = where["output_index"]
        return events + [
            self.event("response.output_item.done", output_index=index, item=item.json(status))
        ]

    def text(self, delta: str, logprobs: list[dict[str, Any]]) -> list[bytes]:
        """Text for the message item (opened first if need be); tokens without text yet keep
        their logprobs for the next text."""
        self.pending += logprobs
        if not delta:
            return []
        events = []
        if self.open is None or self.open.kind != "message":
            events = self._start(Item("message", item_id("msg")))
        assert self.open is not None
        logprobs, self.pending = self.pending, []
        self.open.text += delta
        self.open.logprobs += logprobs
        return events + [
            self.event(
                "response.output_text.delta",
                **self._where(self.open),
                content_index=0,
                delta=delta,
                logprobs=logprobs,
            )
        ]

    def call(
        self, index: int, call_id: str | None, name: str | None, arguments: str
    ) -> list[bytes]:
        events = []
        if call_id is not None:  # the first fragment of a call: a new item
            item = Item("function_call", item_id("fc"), call_id=call_id, name=name or "")
            self.calls[index] = item
            events = self._start(item)
        item = self.calls[index]
        if not arguments:
            return events
        item.text += arguments
        return events + [
            self.event(
                "response.function_call_arguments.delta", **self._where(item), delta=arguments
            )
        ]

    def closing(self, finish_reason: str | None, out: RequestOutput, generated: int
                ) -> list[bytes]:  # fmt: skip
        """The last events: the open item closed, then the whole response (`out`: the last
        delta output; `generated`: the reply's tokens)."""
        status, incomplete = self.shape.status_of(finish_reason)
        events = [] if self.items else self._start(Item("message", item_id("msg")))  # empty
        if self.open is not None and self.open.kind == "message":
            self.open.logprobs += self.pending
        events += self._close("incomplete" if incomplete else "completed")
        self.response = self.shape.json(status, self.items, out, incomplete, generated=generated)
        kind = "response.incomplete" if incomplete else "response.completed"
        return events + [self.event(kind, response=self.response)]

    def failed(self, message: str, code: str | None) -> list[bytes]:
        error = {"code": "server_error", "message": message}
        response = self.shape.json("failed", self.items, error=error)
        return [
            self.event("error", code=code, message=message, param=None),
            self.event("response.failed", response=response),
        ]

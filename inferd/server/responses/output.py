"""Replies in the Responses API's shapes: the response object and its output items (a
`reasoning` item, a `message` with `output_text`, `function_call`s); events.py streams them.

A stream opens with `response.created` and `response.in_progress`; each output item is opened
(`response.output_item.added`, for a message or reasoning also `response.content_part.added`),
grows (`response.output_text.delta`, `response.reasoning_text.delta`,
`response.function_call_arguments.delta`) and is closed
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
from inferd.server.responses.reasoning import reasoning_item
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
    """One output item: reasoning or a message (its text), or a function call (its arguments)."""

    kind: str  # "reasoning", "message" or "function_call"
    id: str
    text: str = ""  # the reasoning's or message's text, or the call's arguments
    call_id: str = ""
    name: str = ""
    logprobs: list[dict[str, Any]] = field(default_factory=list)

    def json(self, status: str) -> dict[str, Any]:
        if self.kind == "reasoning":
            return reasoning_item(self.id, self.text, status)
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


def items_of(
    content: str, calls: list[ToolCall], logprobs: list[dict[str, Any]], reasoning: str = ""
) -> list[Item]:
    """A whole reply's items: its reasoning (if any), its text (if any, or if there is nothing
    else), then its calls."""
    items = [Item("reasoning", item_id("rs"), reasoning)] if reasoning else []
    if content or not (calls or reasoning):
        items.append(Item("message", item_id("msg"), content, logprobs=logprobs))
    calls_items = [Item("function_call", item_id("fc"), c.arguments, c.id, c.name) for c in calls]
    return items + calls_items


def as_chat_message(items: list[Item]) -> dict[str, Any]:
    """The reply as a chat assistant message, for the conversation a stored response continues."""
    text = "".join(i.text for i in items if i.kind == "message")
    reasoning = "".join(i.text for i in items if i.kind == "reasoning")
    calls = [
        {"id": i.call_id, "type": "function", "function": {"name": i.name, "arguments": i.text}}
        for i in items
        if i.kind == "function_call"
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message


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
            "reasoning": body.reasoning,
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

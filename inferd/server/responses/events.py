"""The typed events of one streamed response (the shapes are output.py's): each output item is
opened, grows and is closed before the next opens; every event has a `sequence_number`.

    reasoning  response.output_item.added, response.content_part.added (reasoning_text),
               response.reasoning_text.delta..., response.reasoning_text.done,
               response.content_part.done, response.output_item.done
    message    the same with output_text parts and response.output_text.delta / .done
    call       response.output_item.added, response.function_call_arguments.delta...,
               response.function_call_arguments.done, response.output_item.done
"""

from __future__ import annotations

from typing import Any

from inferd.outputs import RequestOutput
from inferd.server.http.sse import encode_named_event
from inferd.server.responses.output import Item, ResponseShape, item_id, text_part
from inferd.server.responses.reasoning import reasoning_part


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
        if item.kind != "function_call":
            added["content"] = []
        events.append(self.event("response.output_item.added", output_index=index, item=added))
        if item.kind != "function_call":
            part = text_part("", []) if item.kind == "message" else reasoning_part("")
            events.append(
                self.event(
                    "response.content_part.added", **self._where(item), content_index=0, part=part
                )
            )
        return events

    def _close(self, status: str = "completed") -> list[bytes]:
        item, self.open = self.open, None
        if item is None:
            return []
        where = self._where(item)
        if item.kind == "reasoning":
            text, part = item.text, reasoning_part(item.text)
            events = [
                self.event("response.reasoning_text.done", **where, content_index=0, text=text),
                self.event("response.content_part.done", **where, content_index=0, part=part),
            ]
        elif item.kind == "message":
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

    def reasoning(self, delta: str) -> list[bytes]:
        """Reasoning text for the reasoning item (opened first if need be)."""
        if not delta:
            return []
        events = []
        if self.open is None or self.open.kind != "reasoning":
            events = self._start(Item("reasoning", item_id("rs")))
        assert self.open is not None
        self.open.text += delta
        where = self._where(self.open)
        return events + [
            self.event("response.reasoning_text.delta", **where, content_index=0, delta=delta)
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

"""Choices from engine outputs: whole ones for plain responses, deltas for streams.

The engine reports each sample cumulatively (all text and tokens so far, every step); a stream
sends only what is new. One `DeltaTracker` per stream remembers, per choice index, how much text
and how many tokens were sent, and whether the finish was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inferd.outputs import CompletionOutput, PositionLogprobs, RequestOutput
from inferd.server.responses import TokenText, completion_logprobs


@dataclass
class Echo:
    """The prompt part of a completions choice when the client asked for `echo`."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    entries: list[PositionLogprobs | None] = field(default_factory=list)

    @classmethod
    def of(cls, out: RequestOutput, text: str, with_logprobs: bool) -> Echo:
        entries = list(out.prompt_logprobs or []) if with_logprobs else []
        entries += [None] * (len(out.prompt_token_ids) - len(entries))
        return cls(text, list(out.prompt_token_ids), entries)


def full_sample(c: CompletionOutput, echo: Echo | None):
    """(text, token ids, logprob entries) of a choice, echoed prompt first."""
    entries = list(c.logprobs or [])
    if echo is None:
        return c.text, list(c.token_ids), entries
    return echo.text + c.text, echo.token_ids + list(c.token_ids), echo.entries + entries


def completion_choice(
    index: int, c: CompletionOutput, echo: Echo | None, logprobs: bool, texts: TokenText
) -> dict[str, Any]:
    text, ids, entries = full_sample(c, echo)
    lp = completion_logprobs(ids, entries, texts)[0] if logprobs else None
    return {
        "index": index,
        "text": text,
        "logprobs": lp,
        "finish_reason": c.finish_reason,
        "stop_reason": c.stop_reason,
    }


@dataclass
class Delta:
    text: str
    token_start: int  # the new tokens are [token_start, token_end) of the choice
    token_end: int
    finish_reason: str | None  # set on the choice's last delta only


class DeltaTracker:
    def __init__(self) -> None:
        self._text: dict[int, int] = {}
        self._tokens: dict[int, int] = {}
        self._done: set[int] = set()

    def take(
        self, index: int, text: str, num_tokens: int, finish_reason: str | None, tokens_too: bool
    ) -> Delta | None:
        """What is new in choice `index`, or None when there is nothing worth a chunk
        (`tokens_too`: new tokens alone are worth one, for their logprobs)."""
        if index in self._done:
            return None
        sent_text, sent_tokens = self._text.get(index, 0), self._tokens.get(index, 0)
        new_text = text[sent_text:]
        new_tokens = num_tokens > sent_tokens
        if not new_text and finish_reason is None and not (tokens_too and new_tokens):
            return None
        self._text[index] = len(text)
        self._tokens[index] = num_tokens
        if finish_reason is not None:
            self._done.add(index)
        return Delta(new_text, sent_tokens, num_tokens, finish_reason)

    def finished(self, index: int) -> bool:
        return index in self._done

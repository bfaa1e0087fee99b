"""Choices from engine outputs: whole ones for plain responses, deltas for streams.

A plain response's outputs are cumulative (its last holds everything); a stream's hold only
what each step added (RequestOutputKind.DELTA), and `ChoiceDeltas` turns them into chunks,
keeping per choice only the news not sent yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inferd.outputs import CompletionOutput, PositionLogprobs, RequestOutput
from inferd.server.openai.shapes import TokenText, completion_logprobs


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
class ChoiceDelta:
    """What one chunk of a streamed choice sends."""

    text: str  # with the echoed prompt's text first on the choice's first chunk
    token_ids: list[int]  # the generated tokens (the echoed prompt's are in `echo`)
    logprobs: list[PositionLogprobs]  # their entries (empty when none were asked for)
    finish_reason: str | None  # set on the choice's last chunk only
    first: bool  # the choice's first chunk
    echo: Echo | None  # the echoed prompt, on the first chunk only


@dataclass
class _Unsent:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] = field(default_factory=list)
    echo: Echo | None = None
    first: bool = True


class ChoiceDeltas:
    """The chunks of a stream's choices from the engine's delta outputs (RequestOutputKind.
    DELTA): per choice index, the news not sent yet. New text or the finish is worth a chunk,
    and with `tokens_too` new tokens alone are (for their logprobs); news worth none waits for
    the next (e.g. a token whose character is still incomplete). A finished choice takes
    nothing more."""

    def __init__(self, tokens_too: bool) -> None:
        self.tokens_too = tokens_too
        self._unsent: dict[int, _Unsent] = {}
        self._done: set[int] = set()

    def started(self, index: int) -> bool:
        return index in self._unsent or index in self._done

    def take(self, index: int, c: CompletionOutput, echo: Echo | None = None) -> ChoiceDelta | None:
        """Add a delta output's sample `c` to choice `index` (`echo`: its echoed prompt, given
        with the choice's first news); what to send now, or None."""
        if index in self._done:
            return None
        unsent = self._unsent.get(index)
        if unsent is None:
            unsent = self._unsent[index] = _Unsent(echo=echo, text=echo.text if echo else "")
        unsent.text += c.text
        unsent.token_ids += c.token_ids
        if c.logprobs:
            unsent.logprobs += c.logprobs
        echoed_ids = unsent.echo is not None and bool(unsent.echo.token_ids)
        new_tokens = bool(unsent.token_ids) or echoed_ids
        if not unsent.text and c.finish_reason is None and not (self.tokens_too and new_tokens):
            return None
        if c.finish_reason is not None:
            self._done.add(index)
            del self._unsent[index]
        else:
            self._unsent[index] = _Unsent(first=False)
        return ChoiceDelta(unsent.text, unsent.token_ids, unsent.logprobs, c.finish_reason,
                           unsent.first, unsent.echo)  # fmt: skip

"""Response pieces in the OpenAI shapes: usage, logprobs (completions and chat styles), ids.

Pure functions of engine outputs, so they are unit-tested without a model or a server.
"""

from __future__ import annotations

import math
import re
import uuid
from typing import Any

from inferd.outputs import PositionLogprobs, RequestOutput

# JSON has no -inf; a token the model rules out gets this floor (what clients already expect
# from other OpenAI-compatible servers).
LOGPROB_FLOOR = -9999.0
_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def clamp_logprob(value: float) -> float:
    return value if math.isfinite(value) else LOGPROB_FLOOR


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        # Prompt tokens whose KV came from the prefix cache (OpenAI's field).
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def usage_of(outputs: list[RequestOutput]) -> dict[str, Any]:
    """Prompt tokens count once per prompt, however many samples (n) it has."""
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return usage(prompt, completion, sum(o.num_cached_tokens for o in outputs))


class TokenText:
    """The text (and bytes) of single tokens, as logprobs report them; cached per token id."""

    def __init__(self, tokenizer: Any, limit: int = 1 << 16):
        self.tokenizer = tokenizer
        self.limit = limit
        self._cache: dict[int, str] = {}

    def text(self, token_id: int) -> str:
        cached = self._cache.get(token_id)
        if cached is None:
            cached = self.tokenizer.decode([token_id], skip_special_tokens=False)
            if len(self._cache) >= self.limit:  # bounded: the vocabulary can be 256k tokens
                self._cache.clear()
            self._cache[token_id] = cached
        return cached

    def bytes(self, token_id: int) -> list[int]:
        # A byte-fallback token is one byte of a UTF-8 sequence: its text alone is U+FFFD, but
        # clients rebuild the text from the bytes, so report the byte itself.
        pieces = self.tokenizer.convert_ids_to_tokens([token_id])
        match = _BYTE_TOKEN.match(pieces[0] or "") if pieces else None
        if match:
            return [int(match.group(1), 16)]
        return list(self.text(token_id).encode("utf-8"))


class TokenIdText(TokenText):
    """`return_tokens_as_token_ids` (vLLM): tokens in logprobs are written "token_id:N", so a
    client can tell apart tokens whose text is the same (or not valid UTF-8 alone)."""

    def __init__(self, texts: TokenText):
        super().__init__(texts.tokenizer, texts.limit)

    def text(self, token_id: int) -> str:
        return f"token_id:{token_id}"

    def bytes(self, token_id: int) -> list[int]:
        return list(self.text(token_id).encode("utf-8"))


def prompt_logprobs_json(
    entries: list[PositionLogprobs | None] | None, texts: TokenText
) -> list[dict[str, dict[str, Any]] | None] | None:
    """vLLM's `prompt_logprobs`: per prompt position (the first is None: nothing predicts it),
    token id → {logprob, rank, decoded_token}, holding the prompt token and the top ones."""
    if entries is None:
        return None
    return [
        None
        if entry is None
        else {
            str(t): {
                "logprob": clamp_logprob(lp.logprob),
                "rank": lp.rank,
                "decoded_token": texts.text(t),
            }
            for t, lp in entry.items()
        }
        for entry in entries
    ]


def completion_logprobs(
    token_ids: list[int],
    entries: list[PositionLogprobs | None],
    texts: TokenText,
    text_offset: int = 0,
) -> tuple[dict[str, list], int]:
    """The legacy completions format (tokens, token_logprobs, top_logprobs, text_offset) and the
    offset after the last token. `top_logprobs` holds the requested alternatives plus the
    chosen token, as the OpenAI API documents; an entry is None where nothing predicted the
    token (the first prompt token when echoing)."""
    out: dict[str, list] = {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }
    for token, entry in zip(token_ids, entries, strict=False):
        text = texts.text(token)
        out["tokens"].append(text)
        out["text_offset"].append(text_offset)
        text_offset += len(text)
        if entry is None or token not in entry:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        out["token_logprobs"].append(clamp_logprob(entry[token].logprob))
        out["top_logprobs"].append(
            {texts.text(t): clamp_logprob(lp.logprob) for t, lp in entry.items()}
        )
    return out, text_offset


def chat_logprobs(
    token_ids: list[int], entries: list[PositionLogprobs], texts: TokenText, top: int
) -> list[dict[str, Any]]:
    """The chat format: per token, its text, logprob and bytes, and the `top` most likely
    alternatives in rank order."""
    content = []
    for token, entry in zip(token_ids, entries, strict=False):
        chosen = entry.get(token)
        alternatives = sorted(
            ((t, lp) for t, lp in entry.items() if lp.rank <= top), key=lambda x: x[1].rank
        )
        content.append(
            {
                "token": texts.text(token),
                "logprob": clamp_logprob(chosen.logprob) if chosen else LOGPROB_FLOOR,
                "bytes": texts.bytes(token),
                "top_logprobs": [
                    {
                        "token": texts.text(t),
                        "logprob": clamp_logprob(lp.logprob),
                        "bytes": texts.bytes(t),
                    }
                    for t, lp in alternatives
                ],
            }
        )
    return content

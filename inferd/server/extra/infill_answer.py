"""The answer of `/infill` for one completion, in llama.cpp's /completion shape: `index`,
`content`, `stop`, `stop_type` (`eos`, `word`, `limit`), `stopping_word`, the token counts and
`timings`. With `n_cmpl` > 1 there is one per completion (`index` 0..n_cmpl-1): a JSON array of
them in index order, or in a stream each completion's own last event (infill.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferd.outputs import RequestOutput


@dataclass
class Completion:
    """One completion of an /infill request as the route reads it: its text so far, and why it
    ended (`finish`, `stop`: the engine's; `limited`: a rule of the route ended it)."""

    index: int
    text: str = ""
    tokens: int = 0
    finish: str | None = None
    stop: int | str | None = None
    limited: bool = False
    checked: int = 0  # where n_indent's next check starts (infill_rules.indent_cut)
    ended: bool = False

    def end(self, limited: bool = False) -> None:
        self.ended = True
        self.limited = self.limited or limited


def answer(
    c: Completion, content: str, out: RequestOutput | None, model: str, prompt_only: bool
) -> dict[str, Any]:
    """Completion `c`'s answer with `content` (the whole text, or a stream's last piece); `out`:
    the request's last output (its prompt, cache and timing counts); `prompt_only`: n_predict 0,
    where the token computed is not part of the answer."""
    stop = c.stop
    if c.limited or prompt_only:
        stop_type, stop = "limit", None
    else:
        kinds = {"stop": "word" if isinstance(stop, str) else "eos", "length": "limit"}
        stop_type = kinds.get(c.finish or "", "none")
    m = out.metrics if out is not None else None
    prompt_ms = predicted_ms = None
    if m is not None and m.first_token_time is not None:
        if m.first_scheduled_time is not None:
            prompt_ms = round((m.first_token_time - m.first_scheduled_time) * 1000, 3)
        if m.last_token_time is not None:
            predicted_ms = round((m.last_token_time - m.first_token_time) * 1000, 3)
    generated = 0 if prompt_only else c.tokens
    prompt_n = prompt_len = cached = 0
    if out is not None:
        prompt_len, cached = len(out.prompt_token_ids), out.num_cached_tokens
        prompt_n = prompt_len - cached
    return {
        "index": c.index,
        "content": content,
        "stop": True,
        "model": model,
        "stop_type": stop_type,
        "stopping_word": stop if isinstance(stop, str) else "",
        "tokens_predicted": generated,
        "tokens_evaluated": prompt_len,
        "tokens_cached": cached,
        "truncated": False,
        "timings": {
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": _per(prompt_ms, prompt_n),
            "prompt_per_second": _rate(prompt_n, prompt_ms),
            "predicted_n": generated,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": _per(predicted_ms, generated),
            "predicted_per_second": _rate(generated, predicted_ms),
        },
    }


def _per(ms: float | None, n: int) -> float | None:
    return round(ms / n, 3) if ms is not None and n > 0 else None


def _rate(n: int, ms: float | None) -> float | None:
    return round(n * 1000 / ms, 3) if ms and n > 0 else None

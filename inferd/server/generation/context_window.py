"""A context window smaller than the model's, chosen by the client (Ollama's `num_ctx`).

The prompt and the reply must fit in it together. A prompt that does not fit is refused with
both lengths: Ollama would keep only the prompt's end (a known complaint: a long document loses
its beginning, silently), and inferd never drops what a client sent. The reply is bounded by
what the window leaves (Ollama stops there too, or shifts the window: inferd stops, with
`done_reason: "length"`).
"""

from __future__ import annotations

from dataclasses import dataclass

from inferd.errors import InvalidRequest
from inferd.sampling_params import SamplingParams


@dataclass(frozen=True)
class ContextWindow:
    tokens: int  # the window the client asked for (prompt + reply)
    param: str = "options.num_ctx"  # the client's name for it, in errors

    def bound(self, params: SamplingParams, prompt_tokens: int) -> None:
        """Bound `params.max_tokens` to what the window leaves after the prompt (a 400 naming
        the window when the prompt leaves no room for a single token)."""
        room = self.tokens - prompt_tokens
        if room < 1:
            raise InvalidRequest(
                self.param,
                f"the prompt is {prompt_tokens} tokens, which leaves no room for a reply in "
                f"{self.param}={self.tokens} (this server refuses instead of truncating the "
                f"prompt): raise {self.param} above {prompt_tokens} or shorten the prompt",
            )
        # NOTE: SamplingParams checked max_tokens when built; the bound only lowers it.
        params.max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)

"""How long an engine may go without finishing a step, while it has work, and still be healthy.

The bound grows with what a step may legitimately take here: the slowest seconds per token of
recent steps times the most tokens a step can hold, four times over, on top of `stall_timeout`;
a busy server making slow but steady steps stays healthy. The loop that runs the steps feeds it
(core_loop.py, in a thread or in a core's own process).
"""

from __future__ import annotations

from collections import deque

from inferd.engine_client import EngineStats

_RECENT_STEPS = 32  # steps whose speed sets the stall bound
_STEP_MARGIN = 4.0  # how many times its slowest recent speed a step may take
# A step's seconds per token count toward a full step's only when it held at least this share
# of the step budget: in a small step, fixed costs (a kernel compiled on first use, a one-token
# decode's launch overhead) would pass for per-token cost and inflate the bound without end.
_RATE_SHARE = 1 / 8


class StallBound:
    def __init__(self, stall_timeout: float, step_tokens: int = 0):
        """`step_tokens`: the most tokens one step can hold (0: learned from the steps)."""
        self.stall_timeout = stall_timeout
        self._step_tokens = step_tokens
        self._recent: deque[tuple[float, int]] = deque(maxlen=_RECENT_STEPS)  # (s, tokens)
        self._slowest_step = 0.0  # seconds of the slowest recent step
        self._slowest_per_token = 0.0  # the same per token, over the steps that were large

    def bound(self) -> float:
        """Seconds without a completed step, while busy, after which the engine is stalled: a
        margin over the slowest recent step, or over a full step at the slowest recent speed."""
        full_step = self._slowest_per_token * self._step_tokens
        return self.stall_timeout + _STEP_MARGIN * max(self._slowest_step, full_step)

    def note(self, seconds: float, before: EngineStats, after: EngineStats) -> None:
        """A step took `seconds`; the stats before and after it say how many rows it computed:
        prompt and generated tokens, plus the speculative drafts it verified and rejected
        (accepted ones are among the generated)."""
        rejected = (after.spec_decode_num_draft_tokens - before.spec_decode_num_draft_tokens) - (
            after.spec_decode_num_accepted_tokens - before.spec_decode_num_accepted_tokens
        )
        tokens = (
            (after.prompt_tokens - before.prompt_tokens)
            + (after.generation_tokens - before.generation_tokens)
            + max(0, rejected)
        )
        if tokens > 0:
            self._recent.append((seconds, tokens))
            self._step_tokens = max(self._step_tokens, tokens)
            large = [s / n for s, n in self._recent if n >= _RATE_SHARE * self._step_tokens]
            self._slowest_per_token = max(large, default=0.0)
            self._slowest_step = max(s for s, _ in self._recent)

"""When to stop proposing for a sequence: per-sequence acceptance tracking with back-off.

A verification step with d drafts computes 1 + d tokens to gain the accepted ones. On a CPU a
decode step is bound by reading the weights, so the extra rows cost a fraction of a step each,
but not nothing (the LM head's work grows with the rows): drafts that keep failing make the
sequence slower than plain decoding. The gate below watches the acceptance of each sequence's
recent verifications and pauses its proposals when too few drafts are accepted, for a pause that
doubles each time the sequence fails again after a pause, so a sequence where lookup never pays
spends a vanishing share of its steps on failed drafts, while one whose text turns repetitive
later (a copy starting mid-answer) is found again.

Steps without a draft (no n-gram match) cost nothing extra and are not judged.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class AdaptiveSettings:
    """`min_acceptance_rate`: accepted / drafted tokens over the last `window` verifications below
    which a sequence pauses. Drafting pays while rate > c, the cost of one more row relative to
    a plain step; 0.25 leaves a margin over the c measured on the embedded model (see the spec
    decode benchmark). A fresh sequence is judged after 2 verifications, a resumed one after 1
    (it failed before); pauses run `first_pause` steps, doubling per repeated failure up to
    `max_pause`, and reset to `first_pause` after a full window at or above the rate."""

    min_acceptance_rate: float = 0.25
    window: int = 4
    first_pause: int = 16
    max_pause: int = 512

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_acceptance_rate <= 1.0:
            raise ValueError(
                f"min_acceptance_rate must be in [0, 1], got {self.min_acceptance_rate}"
            )
        if self.window < 2:
            raise ValueError(f"window must be >= 2, got {self.window}")
        if not 1 <= self.first_pause <= self.max_pause:
            raise ValueError(
                f"need 1 <= first_pause <= max_pause, got {self.first_pause}, {self.max_pause}"
            )


class DraftGate:
    """One sequence's on/off state. Call `allows()` once per decode step of the sequence (it
    counts a pause down), and `record()` after each verification that had drafts."""

    __slots__ = ("_settings", "_recent", "_pause", "_pause_left", "_resumed")

    def __init__(self, settings: AdaptiveSettings) -> None:
        self._settings = settings
        self._recent: deque[tuple[int, int]] = deque(maxlen=settings.window)
        self._pause = settings.first_pause  # length of the next pause
        self._pause_left = 0
        self._resumed = False

    @property
    def paused(self) -> bool:
        return self._pause_left > 0

    def allows(self) -> bool:
        if self._pause_left > 0:
            self._pause_left -= 1
            return False
        return True

    def record(self, num_drafted: int, num_accepted: int) -> None:
        if not 0 <= num_accepted <= num_drafted:
            raise ValueError(
                f"num_accepted must be in [0, num_drafted={num_drafted}], got {num_accepted}"
            )
        if num_drafted == 0:
            return
        s = self._settings
        self._recent.append((num_drafted, num_accepted))
        drafted = sum(d for d, _ in self._recent)
        rate = sum(a for _, a in self._recent) / drafted
        judged_after = 1 if self._resumed else 2
        if len(self._recent) >= judged_after and rate < s.min_acceptance_rate:
            self._pause_left = self._pause
            self._pause = min(2 * self._pause, s.max_pause)
            self._recent.clear()
            self._resumed = True
        elif len(self._recent) == s.window:
            # A full window at a good rate: this sequence pays, forget its earlier failures.
            self._pause = s.first_pause
            self._resumed = False

"""When to stop, and when to resume, proposing for a sequence.

A verification step with d drafts computes 1 + d tokens to gain the accepted ones. On a CPU a
decode step is bound by reading the weights, so the extra rows cost a fraction of a step each,
but not nothing (the LM head's work grows with the rows): drafts that keep failing make a
sequence slower than plain decoding. So each sequence has a gate:

- on: its drafts are verified; when its last few verifications accepted fewer than
  `min_mean_accepted` tokens each on average, the gate turns off;
- off: the proposer still looks its drafts up (microseconds) but nobody verifies them; they are
  "shadow" drafts, scored for free against the tokens plain decoding then produces. The gate
  turns back on after enough consecutive shadows that would have paid. Each time a sequence
  fails again after resuming, the number of good shadows needed doubles (the back-off), so a
  sequence that flaps between helpful and useless text settles on plain decoding.

Scoring shadows rather than pausing for a fixed number of steps matters for copying: a model
that wanders off for a sentence and then resumes copying gets its drafts back within a step or
two, where a timed pause would decode the copy one token at a time. Under sampling a shadow's
score is the same random variable as a verification's (a sample equals the draft with the
target's probability of the draft), so shadows judge sampled sequences fairly too.

Steps without a draft (no n-gram match) cost nothing extra and are not judged.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class AdaptiveSettings:
    """`min_mean_accepted`: accepted tokens per verification below which drafting does not pay.
    A verification costs more than a plain step by some fraction c of one, mostly independent
    of the number of drafts on a CPU (the kernels switch from matrix-vector to matrix-matrix
    products at two rows, then grow slowly), so the bar is in tokens, not a rate. 1.0 is above
    the c measured on the embedded model (0.5 to 0.9 for 2 to 9 rows, one thread, on a shared
    and noisy AVX-512 VNNI/BF16 CPU: to be re-measured on a quiet one).

    A gate that is on is judged over its last `window` verifications (from the second one on);
    one that is off resumes after `resume_after` consecutive shadows that reach the bar, doubled
    per repeated failure up to `max_resume_after`, and reset after a full good window."""

    min_mean_accepted: float = 1.0
    window: int = 4
    resume_after: int = 1
    max_resume_after: int = 16

    def __post_init__(self) -> None:
        if self.min_mean_accepted < 0:
            raise ValueError(f"min_mean_accepted must be >= 0, got {self.min_mean_accepted}")
        if self.window < 2:
            raise ValueError(f"window must be >= 2, got {self.window}")
        if not 1 <= self.resume_after <= self.max_resume_after:
            raise ValueError(
                f"need 1 <= resume_after <= max_resume_after, got {self.resume_after}, "
                f"{self.max_resume_after}"
            )


class DraftGate:
    """One sequence's on/off state: `record()` after each verification while on,
    `record_shadow()` for each scored shadow draft while off."""

    __slots__ = ("_settings", "_recent", "_on", "_needed", "_good_shadows")

    def __init__(self, settings: AdaptiveSettings) -> None:
        self._settings = settings
        self._recent: deque[int] = deque(maxlen=settings.window)  # accepted per verification
        self._on = True
        self._needed = settings.resume_after  # good shadows in a row to turn back on
        self._good_shadows = 0

    @property
    def on(self) -> bool:
        return self._on

    def record(self, num_drafted: int, num_accepted: int) -> None:
        """A verification of real drafts (ignored while off: a step scheduled before the gate
        turned off can still report)."""
        _check(num_drafted, num_accepted)
        if num_drafted == 0 or not self._on:
            return
        s = self._settings
        self._recent.append(num_accepted)
        mean = sum(self._recent) / len(self._recent)
        if len(self._recent) >= 2 and mean < s.min_mean_accepted:
            self._on = False
            self._recent.clear()
            self._good_shadows = 0
        elif len(self._recent) == s.window:
            # A full window at a good rate: this sequence pays, forget its earlier failures.
            self._needed = s.resume_after

    def record_shadow(self, num_drafted: int, num_accepted: int) -> None:
        """What a draft that was not verified would have scored."""
        _check(num_drafted, num_accepted)
        if num_drafted == 0 or self._on:
            return
        s = self._settings
        if num_accepted < s.min_mean_accepted:
            self._good_shadows = 0
            return
        self._good_shadows += 1
        if self._good_shadows >= self._needed:
            self._on = True
            # Should it fail again, it must show more before the next resume.
            self._needed = min(2 * self._needed, s.max_resume_after)


def _check(num_drafted: int, num_accepted: int) -> None:
    if not 0 <= num_accepted <= num_drafted:
        raise ValueError(
            f"num_accepted must be in [0, num_drafted={num_drafted}], got {num_accepted}"
        )

"""How many drafts to verify in a step: the number that maximises expected tokens per second.

A draft costs a row of the step, and what a row costs depends on the machine and the batch: on
a GPU a few more rows are nearly free; on a CPU (the embedded model, block kernels) a second row
costs a fraction of a step, each further one about half a step, because the block products
are bound by arithmetic past two rows. What a draft brings depends on the text: copying, nearly
one token per draft; free writing, little. So the planner measures both as it goes:

- `AcceptanceEstimate` (per sequence): the chance p that a draft token is accepted given that the
  ones before it were, from the sequence's recent verifications, with a forgetting factor. While
  the planner verifies nothing for a sequence, the drafts it would have verified are "shadows",
  scored for free against the tokens decoding then produces, so a sequence whose text becomes
  copyable is noticed.
- `StepCosts`: the seconds of recent decode steps by their number of rows (median of the last
  few). A row count not measured lately is assumed cheap (interpolated, or a quarter of the
  average row's cost past the largest measured): the planner then tries it and the measurement
  decides, so it finds where rows are cheap on any machine without a calibration run, and a
  measurement spoilt by a busy moment is retried after a while rather than trusted forever.
- `plan_drafts`: draft j of a sequence (0-based) adds p^(j+1) expected tokens. Drafts are added
  best gain first, and the plan keeps the number of them with the highest expected tokens per
  second: (sequences + gains) / (step seconds + sampling seconds per token × tokens). A plan
  with drafts must beat the plan without by `MARGIN`, so noise in the estimates does not buy
  rows that barely pay: a workload with nothing worth looking up verifies (almost) nothing.
"""

from __future__ import annotations

import heapq
import statistics
from collections import deque
from collections.abc import Sequence

# Acceptance estimate: start at 1/2 (2 pseudo-trials), forget 20% per verification.
PRIOR_ACCEPTED, PRIOR_TRIALS, DECAY = 1.0, 2.0, 0.8
# Unmeasured rows past the largest measured count: each costs this share of an average row.
OPTIMISM = 0.25
RECENT_STEPS = 8  # steps per row count whose median is the cost
STALE_AFTER = 100  # recorded steps after which a row count's cost counts as unmeasured
MARGIN = 0.02  # a plan with drafts must promise this much more tokens per second


class AcceptanceEstimate:
    """One sequence's chance that a draft token is accepted, and its pending shadow draft."""

    __slots__ = ("accepted", "trials", "shadow", "shadow_at")

    def __init__(self) -> None:
        self.accepted, self.trials = PRIOR_ACCEPTED, PRIOR_TRIALS
        self.shadow: list[int] = []  # drafts not verified, to be scored against what follows
        self.shadow_at = 0  # the sequence length they were proposed at

    @property
    def p(self) -> float:
        return self.accepted / self.trials

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        """A verification (or a scored shadow): the first `num_accepted` of `num_drafted` drafts
        held. Each accepted draft is a success; the first rejected one, if any, a failure."""
        if not 0 <= num_accepted <= num_drafted:
            raise ValueError(
                f"num_accepted must be in [0, num_drafted={num_drafted}], got {num_accepted}"
            )
        if num_drafted == 0:
            return
        failed = 1 if num_accepted < num_drafted else 0
        self.accepted = DECAY * self.accepted + num_accepted
        self.trials = DECAY * self.trials + num_accepted + failed

    def score_shadow(self, tokens: Sequence[int]) -> None:
        """Compare the pending shadow with the tokens decoded since it was proposed; once it is
        decided (a mismatch, or all of it matched), observe it and drop it."""
        if not self.shadow:
            return
        arrived = tokens[self.shadow_at : self.shadow_at + len(self.shadow)]
        matched = 0
        while matched < len(arrived) and arrived[matched] == self.shadow[matched]:
            matched += 1
        if matched < len(arrived) or matched == len(self.shadow):
            self.observe(len(self.shadow), matched)
            self.shadow = []

    def set_shadow(self, drafts: list[int], at: int) -> None:
        """Drafts that were looked up but not verified (kept only if none is pending)."""
        if not self.shadow:
            self.shadow, self.shadow_at = list(drafts), at


class StepCosts:
    """Seconds of recent decode steps by rows (every sequence's last token plus its drafts)."""

    def __init__(self) -> None:
        self._recent: dict[int, deque[float]] = {}
        self._medians: dict[int, float] = {}
        self._last: dict[int, int] = {}  # rows → the step count at its latest record
        self._steps = 0
        self._fresh: dict[int, float] = {}  # the medians not stale: what `seconds` reads

    def record(self, rows: int, seconds: float) -> None:
        self._steps += 1
        if self._steps - self._last.get(rows, self._steps) > STALE_AFTER:
            self._recent.pop(rows)  # a fresh start: the old values may be from another time
        recent = self._recent.setdefault(rows, deque(maxlen=RECENT_STEPS))
        recent.append(seconds)
        self._medians[rows] = statistics.median(recent)
        self._last[rows] = self._steps
        self._fresh = {r: m for r, m in self._medians.items()
                       if self._steps - self._last[r] <= STALE_AFTER}  # fmt: skip

    def seconds(self, rows: int) -> float:
        """Measured, interpolated, or (not measured lately above) optimistically extrapolated;
        in arbitrary units (1 + OPTIMISM per extra row) before any measurement."""
        known = self._fresh
        if rows in known:
            return known[rows]
        below = max((r for r in known if r < rows), default=None)
        above = min((r for r in known if r > rows), default=None)
        if below is None and above is None:
            return 1.0 + OPTIMISM * (rows - 1)
        if above is None:
            return known[below] * (1.0 + OPTIMISM * (rows - below) / below)
        if below is None:
            return known[above] * rows / above
        share = (rows - below) / (above - below)
        return known[below] + share * (known[above] - known[below])


def plan_drafts(
    lookups: Sequence[Sequence[int]],
    acceptance: Sequence[float],
    base_rows: int,
    max_rows: int,
    costs: StepCosts,
    seconds_per_token: float = 0.0,
) -> list[int]:
    """How many of each sequence's looked-up drafts to verify (a prefix of each). `base_rows`:
    the step's rows without drafts, `len(lookups)` of them decoding sequences that emit a token
    each; `max_rows`: the step's token budget; `seconds_per_token`: sampling time per emitted
    token (the same with or without drafts, but it dilutes what drafts save)."""
    expected = float(len(lookups))
    rows = base_rows

    def rate() -> float:
        return expected / (costs.seconds(rows) + seconds_per_token * expected)

    best_rate, best_len = rate() * (1.0 + MARGIN), 0
    heap = [(-acceptance[i], i, 0) for i, drafts in enumerate(lookups) if drafts]
    heapq.heapify(heap)
    order: list[int] = []
    while heap and rows < max_rows:
        gain, i, j = heapq.heappop(heap)
        expected -= gain
        rows += 1
        order.append(i)
        if rate() > best_rate:
            best_rate, best_len = rate(), len(order)
        if j + 1 < len(lookups[i]):
            heapq.heappush(heap, (gain * acceptance[i], i, j + 1))
    counts = [0] * len(lookups)
    for i in order[:best_len]:
        counts[i] += 1
    return counts

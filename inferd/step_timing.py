"""Where an engine step's time goes, as plain data: the phases of a step and cumulative
histograms of their durations, per kind of step, and of the tokens each step computed.

    one step = schedule → prepare → forward → sample → output

* schedule: the scheduler picks the step's sequences and allocates their KV blocks;
* prepare: zeroing and copying KV blocks, building the batch tensors and attention metadata;
* forward: the model (every layer and the LM head of the sampled rows);
* sample: logits rows to token ids (penalties, temperature, top-k/p, logprobs);
* output: appending the tokens, the token stop checks, prefix-cache registration, and each
  request's news for the front end (detokenizing, stop strings and `RequestOutput`s are the
  front end's work, outside the step: engine/frontend/output_processor.py).

A step is a "prefill" step when any of its sequences computes prompt tokens, else a "decode"
step: the two cost differently enough that one mean would describe neither.

The engine's `StepTimer` (inferd/profiling/step_timer.py) fills the histograms; the server
exposes them under `inferd:` (inferd/server/metrics/prometheus.py) and `inferd bench` prints each
phase's mean. They live in this bottom-row module because both read them.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

STEP_PHASES = ("schedule", "prepare", "forward", "sample", "output")
STEP_KINDS = ("decode", "prefill")
# Seconds: from a GPU decode step's phases (tens of microseconds) to a CPU prefill of a full
# token budget (seconds).
PHASE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                 0.5, 1.0, 2.5, 5.0, 10.0)  # fmt: skip
# Tokens computed in one step: vLLM's buckets of `iteration_tokens_total`.
TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@dataclass(frozen=True)
class HistogramData:
    """A snapshot of one histogram. `counts[i]` counts values in (bounds[i-1], bounds[i]]
    (Prometheus' `le` rule); the last entry counts values above the last bound."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float  # sum of the observed values
    count: int

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, values <= it), ending with (inf, count): Prometheus' bucket lines."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out

    def minus(self, earlier: HistogramData) -> HistogramData:
        """What was observed since `earlier` (a snapshot of the same histogram)."""
        counts = tuple(a - b for a, b in zip(self.counts, earlier.counts, strict=True))
        return HistogramData(self.bounds, counts, self.total - earlier.total,
                             self.count - earlier.count)  # fmt: skip

    def plus(self, other: HistogramData) -> HistogramData:
        counts = tuple(a + b for a, b in zip(self.counts, other.counts, strict=True))
        return HistogramData(self.bounds, counts, self.total + other.total,
                             self.count + other.count)  # fmt: skip


class Histogram:
    """A histogram being filled (one engine's, by its loop thread only)."""

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def snapshot(self) -> HistogramData:
        return HistogramData(self.bounds, tuple(self.counts), self.total, self.count)


@dataclass(frozen=True)
class PhaseBreakdown:
    """Means over the steps of one kind: seconds per step and per phase, tokens per step."""

    kind: str
    steps: int
    step_seconds: float
    phase_seconds: dict[str, float]
    tokens_per_step: float

    @property
    def outside_forward(self) -> float:
        """Share of the step spent outside the model's forward: the engine's own (Python)
        overhead, what batching and a leaner loop can win back."""
        return 1.0 - self.phase_seconds["forward"] / self.step_seconds if self.step_seconds else 0.0

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "steps": self.steps,
            "step_ms": 1000.0 * self.step_seconds,
            "phase_ms": {p: 1000.0 * s for p, s in self.phase_seconds.items()},
            "tokens_per_step": self.tokens_per_step,
            "outside_forward_share": self.outside_forward,
        }


@dataclass(frozen=True)
class StepTiming:
    """Cumulative step timings of one engine since it started."""

    phases: dict[tuple[str, str], HistogramData]  # (kind, phase) → seconds per step
    steps: dict[str, HistogramData]  # kind → seconds per whole step
    tokens: dict[str, HistogramData]  # kind → tokens computed per step

    def minus(self, earlier: StepTiming) -> StepTiming:
        """The steps run since `earlier` (a snapshot of the same engine)."""
        return StepTiming(
            {k: h.minus(earlier.phases[k]) for k, h in self.phases.items()},
            {k: h.minus(earlier.steps[k]) for k, h in self.steps.items()},
            {k: h.minus(earlier.tokens[k]) for k, h in self.tokens.items()},
        )

    def plus(self, other: StepTiming) -> StepTiming:
        """Both spans' steps together (e.g. spans of the same engine that are not adjacent)."""
        return StepTiming(
            {k: h.plus(other.phases[k]) for k, h in self.phases.items()},
            {k: h.plus(other.steps[k]) for k, h in self.steps.items()},
            {k: h.plus(other.tokens[k]) for k, h in self.tokens.items()},
        )

    def breakdown(self, kind: str) -> PhaseBreakdown | None:
        """Means per phase over the steps of `kind`; None when there were none."""
        step = self.steps[kind]
        if not step.count:
            return None
        phases = {p: self.phases[kind, p].total / step.count for p in STEP_PHASES}
        return PhaseBreakdown(kind, step.count, step.total / step.count, phases,
                              self.tokens[kind].total / step.count)  # fmt: skip

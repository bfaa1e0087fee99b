"""`StepTimer`: the engine's clock for the phases of every step (inferd/step_timing.py names
them), always on.

    timer.start()            the step begins, in phase "schedule"
    timer.begin("prepare")   ... each later phase, where it begins (executor, runner, engine)
    timer.finish(tokens, prefill)   record the step; or timer.cancel() to drop it

A phase runs until the next `begin`, so the phases of a step add up to its duration; a phase
begun twice in a step (the runner re-enters "prepare" after the executor's share) adds up.
The cost is a `time.perf_counter()` per phase and a histogram update per phase, a few
microseconds per step against the milliseconds a step takes.

While a trace runs (`inferd/profiling/trace.py`), `ranges` opens a named `torch.profiler`
range per phase as well; otherwise it is None and nothing of the profiler is touched.
"""

from __future__ import annotations

from time import perf_counter
from typing import Protocol

from inferd.step_timing import (
    PHASE_BUCKETS,
    STEP_KINDS,
    STEP_PHASES,
    TOKEN_BUCKETS,
    Histogram,
    StepTiming,
)


class PhaseRanges(Protocol):
    """Named profiler ranges that follow the timer (inferd/profiling/instrument.py)."""

    def start_step(self) -> None: ...

    def switch(self, phase: str) -> None: ...

    def end_step(self) -> None: ...


class StepTimer:
    def __init__(self) -> None:
        self._phases = {(k, p): Histogram(PHASE_BUCKETS) for k in STEP_KINDS for p in STEP_PHASES}
        self._steps = {k: Histogram(PHASE_BUCKETS) for k in STEP_KINDS}
        self._tokens = {k: Histogram(TOKEN_BUCKETS) for k in STEP_KINDS}
        self.ranges: PhaseRanges | None = None  # set only while a trace runs
        self._spent = dict.fromkeys(STEP_PHASES, 0.0)
        self._phase: str | None = None  # None: between steps
        self._started = self._mark = 0.0
        # The last recorded step: seconds per phase, and the whole step (tests, logs).
        self.last: dict[str, float] = {}

    def start(self) -> None:
        """A step begins (in "schedule"). A step that never finished (it raised) is dropped."""
        now = perf_counter()
        self._spent = dict.fromkeys(STEP_PHASES, 0.0)
        self._started = self._mark = now
        self._phase = "schedule"
        if self.ranges is not None:
            self.ranges.start_step()

    def begin(self, phase: str) -> None:
        """From now on the step is in `phase`. Outside a step (a component driven on its own,
        as in unit tests) this does nothing."""
        if self._phase is None:
            return
        now = perf_counter()
        self._spent[self._phase] += now - self._mark
        self._phase, self._mark = phase, now
        if self.ranges is not None:
            self.ranges.switch(phase)

    def finish(self, num_tokens: int, prefill: bool) -> float | None:
        """Record the step: `num_tokens` computed, `prefill` when any were prompt tokens.
        Returns its seconds; None when no step was in progress (it was cancelled)."""
        if self._phase is None:
            return None
        now = perf_counter()
        self._spent[self._phase] += now - self._mark
        self._phase = None
        if self.ranges is not None:
            self.ranges.end_step()
        kind = "prefill" if prefill else "decode"
        for phase, seconds in self._spent.items():
            self._phases[kind, phase].observe(seconds)
        self._steps[kind].observe(now - self._started)
        self._tokens[kind].observe(num_tokens)
        self.last = {**self._spent, "step": now - self._started}
        return now - self._started

    def cancel(self) -> None:
        """Drop the step in progress (it scheduled nothing, or failed)."""
        if self._phase is not None and self.ranges is not None:
            self.ranges.end_step()
        self._phase = None

    def snapshot(self) -> StepTiming:
        return StepTiming(
            {k: h.snapshot() for k, h in self._phases.items()},
            {k: h.snapshot() for k, h in self._steps.items()},
            {k: h.snapshot() for k, h in self._tokens.items()},
        )

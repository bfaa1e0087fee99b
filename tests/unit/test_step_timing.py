"""The step timer and its histograms, on a fake clock: milliseconds, no model."""

from __future__ import annotations

import math

import pytest

from inferd.profiling import step_timer as st
from inferd.step_timing import PHASE_BUCKETS, STEP_PHASES, Histogram, HistogramData


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr(st, "perf_counter", c)
    return c


def run_step(timer: st.StepTimer, clock: FakeClock, spent: dict[str, float], tokens: int = 1,
             prefill: bool = False) -> None:  # fmt: skip
    timer.start()
    for i, (phase, seconds) in enumerate(spent.items()):
        if i:
            timer.begin(phase)
        clock.tick(seconds)
    timer.finish(tokens, prefill)


def test_histogram_buckets_follow_prometheus_le():
    h = Histogram((1.0, 2.0))
    for v in (0.5, 1.0, 1.5, 2.0, 3.0):
        h.observe(v)
    snap = h.snapshot()
    assert snap.counts == (2, 2, 1)  # (-inf, 1], (1, 2], (2, inf): a value on a bound is <= it
    assert snap.cumulative() == [(1.0, 2), (2.0, 4), (math.inf, 5)]
    assert snap.count == 5 and snap.total == 8.0 and snap.mean == 1.6
    h.observe(1.2)
    delta = h.snapshot().minus(snap)
    assert delta.counts == (0, 1, 0) and delta.count == 1 and math.isclose(delta.total, 1.2)
    assert delta.plus(snap).counts == h.snapshot().counts
    assert HistogramData((1.0,), (0, 0), 0.0, 0).mean is None


def test_phases_add_up_to_the_step_and_are_recorded_per_kind(clock):
    timer = st.StepTimer()
    spent = {"schedule": 0.001, "prepare": 0.002, "forward": 0.010, "sample": 0.003,
             "output": 0.004}  # fmt: skip
    run_step(timer, clock, spent, tokens=3)
    run_step(timer, clock, {**spent, "forward": 0.5}, tokens=40, prefill=True)
    assert math.isclose(timer.last["step"], sum(timer.last[p] for p in STEP_PHASES))
    timing = timer.snapshot()
    decode, prefill = timing.breakdown("decode"), timing.breakdown("prefill")
    assert decode.steps == prefill.steps == 1
    assert decode.phase_seconds == pytest.approx(spent)
    assert decode.step_seconds == pytest.approx(0.020)
    assert decode.outside_forward == pytest.approx(0.5)  # half the step outside the model
    assert prefill.phase_seconds["forward"] == pytest.approx(0.5)
    assert (decode.tokens_per_step, prefill.tokens_per_step) == (3, 40)
    assert all(timing.phases["decode", p].count == 1 for p in STEP_PHASES)
    assert timing.steps["decode"].counts[PHASE_BUCKETS.index(0.025)] == 1  # 20 ms: (10, 25] ms


def test_a_phase_entered_twice_adds_up(clock):
    timer = st.StepTimer()
    timer.start()
    clock.tick(0.001)
    for phase, seconds in (("prepare", 0.002), ("forward", 0.001), ("prepare", 0.003),
                           ("forward", 0.010)):  # fmt: skip
        timer.begin(phase)
        clock.tick(seconds)
    timer.finish(1, False)
    assert timer.last["prepare"] == pytest.approx(0.005)
    assert timer.last["forward"] == pytest.approx(0.011)
    assert timer.last["step"] == pytest.approx(0.017)


def test_cancelled_and_unstarted_steps_record_nothing(clock):
    timer = st.StepTimer()
    timer.begin("prepare")  # a component driven outside a step: ignored
    timer.finish(5, False)
    timer.start()
    clock.tick(0.5)
    timer.cancel()  # a step that scheduled nothing
    timer.finish(5, False)
    timer.start()
    timer.begin("forward")  # a step that raised: the next start drops it
    timer.start()
    clock.tick(0.002)
    timer.finish(1, False)
    timing = timer.snapshot()
    assert timing.steps["decode"].count == 1 and timing.steps["prefill"].count == 0
    assert timing.breakdown("prefill") is None
    assert timing.steps["decode"].total == pytest.approx(0.002)


def test_minus_isolates_a_span_of_work(clock):
    timer = st.StepTimer()
    run_step(timer, clock, {"schedule": 1.0})
    before = timer.snapshot()
    run_step(timer, clock, {"schedule": 0.001, "forward": 0.003})
    span = timer.snapshot().minus(before)
    b = span.breakdown("decode")
    assert b.steps == 1 and b.step_seconds == pytest.approx(0.004)
    assert b.to_dict()["phase_ms"]["forward"] == pytest.approx(3.0)


class RecordingRanges:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def start_step(self) -> None:
        self.calls.append("start")

    def switch(self, phase: str) -> None:
        self.calls.append(phase)

    def end_step(self) -> None:
        self.calls.append("end")


def test_ranges_follow_the_phases_only_while_set(clock):
    timer = st.StepTimer()
    run_step(timer, clock, {"schedule": 0.001, "forward": 0.001})  # no ranges: nothing to call
    timer.ranges = RecordingRanges()
    run_step(timer, clock, {"schedule": 0.001, "prepare": 0.001, "forward": 0.001})
    timer.start()
    timer.cancel()
    assert timer.ranges.calls == ["start", "prepare", "forward", "end", "start", "end"]


def test_bench_reports_the_breakdown_of_systems_that_time_their_steps():
    from inferd.bench.metrics import SystemResult, compute_metrics
    from inferd.bench.report import phase_lines
    from inferd.bench.systems import begin_measured, step_breakdown
    from inferd.step_timing import PhaseBreakdown

    spent = {"schedule": 0.001, "prepare": 0.001, "forward": 0.015, "sample": 0.002,
             "output": 0.001}  # fmt: skip
    b = PhaseBreakdown("decode", 10, 0.02, spent, 1.0)
    r = SystemResult("inferd", compute_metrics([], 1.0), step_phases=[b])
    (line,) = phase_lines(r)
    assert "decode steps: 10 of 1 tokens, 20 ms each" in line
    assert "forward 15 ms (75.0%)" in line and "outside the forward 25.0%" in line
    assert r.to_dict()["step_phases"][0]["outside_forward_share"] == pytest.approx(0.25)

    class Peer:  # a system that does not time its steps
        pass

    class Timed:
        began = False

        def begin_measured(self):
            self.began = True

        def end_measured(self):
            return [b]

    timed = Timed()
    begin_measured([Peer(), timed])
    assert timed.began and step_breakdown(timed) == [b] and step_breakdown(Peer()) == []

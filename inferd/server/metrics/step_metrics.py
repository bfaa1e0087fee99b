"""The engine's step timings (inferd/step_timing.py) as Prometheus histograms. The engine keeps
the buckets itself (its loop thread observes every step); this collector renders the latest
snapshot that `engine.stats()` carried:

    inferd:step_duration_seconds{step_kind}          one engine step
    inferd:step_phase_seconds{phase, step_kind}      its phases: schedule, prepare, forward,
                                                     sample, output (they add up to the step)
    inferd:iteration_tokens_total                    tokens computed per step (vLLM's name and
                                                     buckets; both kinds together)

`step_kind` is "prefill" for steps that compute prompt tokens, else "decode".
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import HistogramMetricFamily, Metric

from inferd.step_timing import STEP_KINDS, STEP_PHASES, HistogramData, StepTiming


def _buckets(h: HistogramData) -> list[tuple[str, float]]:
    return [("+Inf" if b == float("inf") else repr(float(b)), n) for b, n in h.cumulative()]


class StepTimingCollector:
    """Registered on a server's registry; `timings` (one per engine: the `engine` label) are
    replaced with each stats snapshot."""

    def __init__(self, prefix: str, model_name: str):
        self.prefix, self.model_name = prefix, model_name
        self.timings: list[StepTiming | None] = []

    def describe(self) -> list[Metric]:
        return []  # names are fixed, but families appear only once an engine reports timings

    def collect(self) -> Iterator[Metric]:
        timed = [(str(e), t) for e, t in enumerate(self.timings) if t is not None]
        if not timed:
            return
        p, name = self.prefix, self.model_name
        step = HistogramMetricFamily(p + "step_duration_seconds",
                                     "Duration of one engine step.",
                                     labels=["model_name", "engine", "step_kind"])  # fmt: skip
        phase = HistogramMetricFamily(
            p + "step_phase_seconds",
            "Time per phase of an engine step (schedule, prepare, forward, sample, output).",
            labels=["model_name", "engine", "phase", "step_kind"],
        )
        iteration = HistogramMetricFamily(p + "iteration_tokens_total",
                                          "Histogram of number of tokens per engine step.",
                                          labels=["model_name", "engine"])  # fmt: skip
        for engine, timing in timed:
            for kind in STEP_KINDS:
                h = timing.steps[kind]
                step.add_metric([name, engine, kind], _buckets(h), h.total)
                for ph in STEP_PHASES:
                    h = timing.phases[kind, ph]
                    phase.add_metric([name, engine, ph, kind], _buckets(h), h.total)
            tokens = timing.tokens["decode"].plus(timing.tokens["prefill"])
            iteration.add_metric([name, engine], _buckets(tokens), tokens.total)
        yield from (step, phase, iteration)

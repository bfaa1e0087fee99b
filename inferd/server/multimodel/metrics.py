"""`/metrics` of a server with many models: the pool's own series (loads, unloads, failed loads,
load seconds, per model) and every loaded model's series.

Each model's app has its own registry (server/metrics/prometheus.py) whose series already carry
`model_name`; pasting their texts one after another would repeat `# HELP`/`# TYPE` for the same
family, which Prometheus' text format forbids. So the families are merged by name: one family,
the samples of every model in it. A model that is not loaded has no series (its counters start
again from zero at its next load, which Prometheus' rate() reads as a counter reset).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

PREFIX = "inferd:"
LOAD_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


class ModelMetrics:
    def __init__(self, names: list[str]):
        self.registry = reg = CollectorRegistry()
        self.loads = Counter(PREFIX + "model_loads", "Models loaded", ["model"], registry=reg)
        self.unloads = Counter(PREFIX + "model_unloads", "Models unloaded", ["model"],
                               registry=reg)  # fmt: skip
        self.failures = Counter(PREFIX + "model_load_failures", "Model loads that failed",
                                ["model"], registry=reg)  # fmt: skip
        self.seconds = Histogram(PREFIX + "model_load_seconds", "Seconds to load a model (engine "
                                 "start and app start-up)", ["model"], registry=reg,
                                 buckets=LOAD_BUCKETS)  # fmt: skip
        self.is_loaded = Gauge(PREFIX + "model_loaded", "1 while the model is loaded", ["model"],
                               registry=reg)  # fmt: skip
        for name in names:  # every series exists from the start: a rate over zero is zero
            for family in (self.loads, self.unloads, self.failures, self.is_loaded):
                family.labels(name)

    def loaded(self, name: str, seconds: float) -> None:
        self.loads.labels(name).inc()
        self.seconds.labels(name).observe(seconds)
        self.is_loaded.labels(name).set(1)

    def unloaded(self, name: str) -> None:
        self.unloads.labels(name).inc()
        self.is_loaded.labels(name).set(0)

    def load_failed(self, name: str) -> None:
        self.failures.labels(name).inc()

    def render(self, apps: list[Any]) -> bytes:
        """The text of this registry and of every loaded model's (`apps`: their FastAPI apps)."""
        merged: dict[str, Metric] = {}
        for family in self.registry.collect():
            merged[family.name] = family
        for app in apps:
            state = app.state.inferd
            state.metrics.update_stats(state.client.stats())  # what GET /metrics refreshes
            for family in state.metrics.registry.collect():
                into = merged.get(family.name)
                if into is None:
                    merged[family.name] = into = Metric(family.name, family.documentation,
                                                        family.type, family.unit)  # fmt: skip
                into.samples.extend(family.samples)
        return generate_latest(_Fixed(list(merged.values())))


class _Fixed:
    """A collector of families already collected (generate_latest reads any `collect()`)."""

    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families

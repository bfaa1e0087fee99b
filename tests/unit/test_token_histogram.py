"""The per-token histogram (inferd/server/metrics/token_histogram.py) exports exactly what
prometheus_client's own Histogram does for the same observations."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from inferd.server.metrics.token_histogram import TokenHistogram

BUCKETS = (0.01, 0.1, 1.0)


def _lines(registry: CollectorRegistry) -> list[str]:
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if "_created" not in line and "_sum" not in line]


def _sum(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("itl_seconds_sum", {"model_name": "m"})


def test_it_exports_what_a_prometheus_histogram_exports():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    token = TokenHistogram("itl_seconds", "Gaps.", {"model_name": "m"}, BUCKETS)
    ours.register(token)
    reference = Histogram("itl_seconds", "Gaps.", ["model_name"], registry=theirs,
                          buckets=BUCKETS).labels(model_name="m")  # fmt: skip
    values = [0.0, 0.01, 0.0100001, 0.05, 0.1, 0.5, 1.0, 2.0, 30.0]
    for value in values:
        token.observe(value)
        reference.observe(value)
    token.observe(0.2, 3)  # three gaps at once: one output with three new tokens
    for _ in range(3):
        reference.observe(0.2)
    assert _lines(ours) == _lines(theirs)
    assert _sum(ours) == pytest.approx(_sum(theirs), rel=1e-12)
    assert 'itl_seconds_bucket{le="0.01",model_name="m"} 2.0' in _lines(ours)
    assert 'itl_seconds_count{model_name="m"} 12.0' in _lines(ours)

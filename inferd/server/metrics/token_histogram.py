"""A Prometheus histogram cheap enough to observe once per streamed token (the inter-token
latency), exported in the registry like any other.

Why not prometheus_client's `Histogram`: its `observe` takes a lock and walks every bucket in
Python, and the front end runs it for every token of every stream, right after a forward pass has
pushed its code out of the CPU's caches. Here an observation is one bisection and two additions;
the front end observes only on its event loop's thread, and a scrape reads a copy of the counts.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString


class TokenHistogram:
    def __init__(self, name: str, documentation: str, labels: dict[str, str],
                 buckets: tuple[float, ...]) -> None:  # fmt: skip
        self.name, self.documentation = name, documentation
        self.labels = labels
        self.bounds = sorted(buckets)
        self._counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self._sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        """`times` observations of `value` (a bucket holds values <= its bound)."""
        self._counts[bisect_left(self.bounds, value)] += times
        self._sum += value * times

    def collect(self) -> Iterator[HistogramMetricFamily]:
        counts, total = list(self._counts), self._sum
        family = HistogramMetricFamily(self.name, self.documentation, labels=list(self.labels))
        cumulative, running = [], 0
        for bound, count in zip([*self.bounds, float("inf")], counts, strict=True):
            running += count
            cumulative.append((floatToGoString(bound), running))
        family.add_metric(list(self.labels.values()), cumulative, total)
        yield family

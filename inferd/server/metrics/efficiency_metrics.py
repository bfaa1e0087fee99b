"""Each engine step's use of the machine (inferd/step_efficiency.py) as Prometheus series. The
engine counts; this collector renders the latest snapshot `engine.stats()` carried:

    inferd:step_mbu{step_kind}                     histogram: one step's memory-bandwidth use,
                                                   bytes read / seconds / peak bandwidth
    inferd:step_mfu{step_kind}                     histogram: its FLOPs' use of the peak matrix
                                                   throughput of each weight format
    inferd:step_weight_bytes_read_total{step_kind} counter: weights read
    inferd:step_kv_bytes_read_total{step_kind}     counter: KV cache read
    inferd:step_flops_total{step_kind}             counter: FLOPs computed
    inferd:step_roofline_seconds_total{step_kind, limit}
                                                   counter: the rated steps' time at the memory
                                                   or compute limit
    inferd:step_rated_seconds_total{step_kind}     counter: wall time of the steps held
                                                   against the peaks
    inferd:machine_memory_bandwidth_bytes_per_second, inferd:machine_peak_flops_per_second
      {weight_format}                              gauges: the peaks (once measured)

The histograms, roofline and rated seconds appear only once the machine's peaks are known
(`inferd plan` or `inferd bench` measured them: docs/profiling.md); bytes and FLOPs always.
Time-weighted MBU over 5 minutes, in PromQL:

    rate(inferd:step_roofline_seconds_total{limit="memory"}[5m])
      / ignoring(limit) rate(inferd:step_rated_seconds_total[5m])
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from inferd.step_efficiency import StepEfficiency
from inferd.step_timing import STEP_KINDS, HistogramData


def _buckets(h: HistogramData) -> list[tuple[str, float]]:
    return [("+Inf" if b == float("inf") else repr(float(b)), n) for b, n in h.cumulative()]


class EfficiencyCollector:
    """Registered on a server's registry; `records` (one per engine: the `engine` label) are
    replaced with each stats snapshot."""

    def __init__(self, prefix: str, model_name: str):
        self.prefix, self.model_name = prefix, model_name
        self.records: list[StepEfficiency | None] = []

    def describe(self) -> list[Metric]:
        return []  # families appear only once an engine reports its counts

    def collect(self) -> Iterator[Metric]:
        counted = [(str(e), r) for e, r in enumerate(self.records) if r is not None]
        if not counted:
            return
        p, labels = self.prefix, ["model_name", "engine", "step_kind"]

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> CounterMetricFamily:
            return CounterMetricFamily(p + name, doc, labels=[*labels, *extra])

        weights = counter("step_weight_bytes_read", "Bytes of weights read by engine steps.")
        kv = counter("step_kv_bytes_read", "Bytes of KV cache read by engine steps.")
        flops = counter("step_flops", "Floating-point operations of engine steps.")
        roofline = counter("step_roofline_seconds",
                           "Time the steps held against the peaks would take at the memory or "
                           "compute limit.", ("limit",))  # fmt: skip
        rated = counter("step_rated_seconds", "Wall time of the steps held against the peaks.")
        mbu = HistogramMetricFamily(p + "step_mbu", "Memory-bandwidth utilization of one engine "
                                    "step (bytes read / seconds / peak bandwidth).",
                                    labels=labels)  # fmt: skip
        mfu = HistogramMetricFamily(p + "step_mfu", "FLOPs utilization of one engine step "
                                    "(against each weight format's peak matrix throughput).",
                                    labels=labels)  # fmt: skip
        bandwidth = GaugeMetricFamily(p + "machine_memory_bandwidth_bytes_per_second",
                                      "The machine's measured read bandwidth.",
                                      labels=["model_name", "engine"])  # fmt: skip
        peak = GaugeMetricFamily(p + "machine_peak_flops_per_second",
                                 "The machine's measured matrix throughput per weight format.",
                                 labels=["model_name", "engine", "weight_format"])  # fmt: skip
        rated_any = False
        for engine, record in counted:
            for kind in STEP_KINDS:
                k, at = record.kinds[kind], [self.model_name, engine, kind]
                weights.add_metric(at, k.weight_bytes)
                kv.add_metric(at, k.kv_bytes)
                flops.add_metric(at, k.flops)
                if record.peaks is None:
                    continue
                rated_any = True
                roofline.add_metric([*at, "memory"], k.memory_seconds)
                roofline.add_metric([*at, "compute"], k.compute_seconds)
                rated.add_metric(at, k.rated_seconds)
                mbu.add_metric(at, _buckets(k.mbu), k.mbu.total)
                mfu.add_metric(at, _buckets(k.mfu), k.mfu.total)
            if record.peaks is not None:
                bandwidth.add_metric([self.model_name, engine],
                                     record.peaks.memory_bandwidth_bytes_s)  # fmt: skip
                for fmt, rate in sorted(record.peaks.flops_s.items()):
                    peak.add_metric([self.model_name, engine, fmt], rate)
        yield from (weights, kv, flops)
        if rated_any:
            yield from (roofline, rated, mbu, mfu, bandwidth, peak)

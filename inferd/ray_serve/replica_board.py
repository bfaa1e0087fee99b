"""The ingress's view of the engine replicas, from the reports they push (replica.py): which
ones serve, the sum of their stats (what `EngineClient.stats()` returns, so /metrics reads as
for one engine), and each one's own series with a `replica` label.

A replica leaves the board when it says it stops, when a stream from it broke because its actor
died, or when it has not reported for `stale_after_s`; its counters stay in the sums (a counter
never goes back), its gauges go. A replica that reports again after going stale is back.

    inferd:engine_replicas{state}                       replicas reporting, healthy or not
    inferd:replica_up{replica,node}                     1 healthy, 0 unhealthy
    inferd:replica_num_requests_running{replica,node}   and _waiting, kv_cache_usage_perc
    inferd:replica_<counter>_total{replica,node}        prompt/generation tokens, prefix cache
    inferd:router_decisions_total{decision}             inferd's router: prefix hit or fallback
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from inferd.engine_client import EngineStats
from inferd.ray_serve.wire import ReplicaReport

PREFIX = "inferd:"
_GAUGES = ("num_running", "num_waiting", "kv_cache_usage")
_GAUGE_NAMES = {"num_running": "num_requests_running", "num_waiting": "num_requests_waiting",
                "kv_cache_usage": "kv_cache_usage_perc"}  # fmt: skip
_REPLICA_COUNTERS = ("prompt_tokens", "generation_tokens", "prefix_cache_queries",
                     "prefix_cache_hits", "num_preemptions")  # fmt: skip


def _empty_stats() -> EngineStats:
    return EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0, 0)


def add_stats(total: EngineStats, part: EngineStats, gauges: bool = True) -> EngineStats:
    """`total` + `part`, field by field: counters add, histograms merge; gauges add (the KV
    usage sums too, `stats_of` divides it) unless `gauges` is False."""
    changes = {}
    for f in dataclasses.fields(EngineStats):
        a, b = getattr(total, f.name), getattr(part, f.name)
        if (f.name in _GAUGES or f.name == "lora_resident") and not gauges:
            continue
        if f.name in ("step_timing", "step_efficiency"):  # records with their own `plus`
            changes[f.name] = b if a is None else (a if b is None else a.plus(b))
        elif f.name == "lora_resident":  # adapter names: resident on any replica
            changes[f.name] = tuple(sorted({*a, *b}))
        elif f.name == "lora_requests":  # adapter name -> requests
            changes[f.name] = {n: a.get(n, 0) + b.get(n, 0) for n in {*a, *b}}
        elif f.name == "kv_tiers":  # per tier name, TierStats.plus (the engine's own rule)
            changes[f.name] = _plus_tiers(a, b)
        elif isinstance(a, tuple):
            n = max(len(a), len(b))
            changes[f.name] = tuple((a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0)
                                    for i in range(n))  # fmt: skip
        else:
            changes[f.name] = a + b
    return dataclasses.replace(total, **changes)


def _plus_tiers(a: tuple, b: tuple) -> tuple:
    """Two replicas' KV tiers (TierStats) added tier by tier, matched by name: they are
    records, not numbers, so the position-wise sum of the other tuples cannot add them."""
    merged = {t.name: t for t in a}
    for tier in b:
        merged[tier.name] = merged[tier.name].plus(tier) if tier.name in merged else tier
    return tuple(merged.values())


@dataclass
class _Entry:
    report: ReplicaReport
    at: float  # when it arrived (board clock)


class ReplicaBoard:
    def __init__(self, model_name: str, stale_after_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.model_name = model_name
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._live: dict[str, _Entry] = {}
        self._gone: dict[str, tuple[EngineStats, str]] = {}  # replica → (last stats, why)
        self.decisions: Counter[str] = Counter()
        self.never_reported = True

    # ---- updates (event loop) ----------------------------------------------------------------
    def report(self, report: ReplicaReport) -> None:
        self.never_reported = False
        if report.stopping:
            self._live.pop(report.replica, None)
            self._gone[report.replica] = (report.stats, "it stopped")
            return
        self._gone.pop(report.replica, None)  # back after going stale
        self._live[report.replica] = _Entry(report, self._clock())

    def lost(self, replica: str, why: str) -> None:
        """A stream from `replica` broke: its actor is gone."""
        entry = self._live.pop(replica, None)
        if entry is not None:
            self._gone[replica] = (entry.report.stats, why)

    def count_decision(self, decision: str | None) -> None:
        if decision:
            self.decisions[decision] += 1

    # ---- reads -------------------------------------------------------------------------------
    def live(self) -> list[ReplicaReport]:
        now = self._clock()
        for replica, entry in list(self._live.items()):
            if now - entry.at > self.stale_after_s:
                self.lost(replica, f"no report for {now - entry.at:.0f} s")
        return [e.report for e in self._live.values()]

    def health(self) -> str | None:
        live = self.live()
        if any(r.health is None for r in live):
            return None
        if live:
            reasons = "; ".join(f"replica {r.replica}: {r.health}" for r in live)
            return f"no engine replica is healthy ({reasons})"
        gone = "; ".join(f"replica {k}: {why}" for k, (_, why) in list(self._gone.items())[-4:])
        return "no engine replica is serving" + (f" ({gone})" if gone else "")

    def stats(self) -> EngineStats:
        """The replicas' stats summed: counters over every replica there was, gauges over the
        live ones (KV usage: their mean)."""
        live = self.live()
        total = _empty_stats()
        for stats, _ in self._gone.values():
            total = add_stats(total, stats, gauges=False)
        for r in live:
            total = add_stats(total, r.stats)
        if live:
            total = dataclasses.replace(total, kv_cache_usage=total.kv_cache_usage / len(live))
        return total

    # ---- Prometheus (registered on the server's registry) ------------------------------------
    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        live = self.live()
        labels = ["model_name", "replica", "node"]
        replicas = GaugeMetricFamily(PREFIX + "engine_replicas",
                                     "Engine replicas reporting to this ingress, by health.",
                                     labels=["model_name", "state"])  # fmt: skip
        healthy = sum(r.health is None for r in live)
        replicas.add_metric([self.model_name, "healthy"], healthy)
        replicas.add_metric([self.model_name, "unhealthy"], len(live) - healthy)
        yield replicas
        up = GaugeMetricFamily(PREFIX + "replica_up", "1 while the replica's engine is healthy.",
                               labels=labels)  # fmt: skip
        gauges = {g: GaugeMetricFamily(PREFIX + "replica_" + _GAUGE_NAMES[g],
                                       f"One replica's {_GAUGE_NAMES[g]}.", labels=labels)
                  for g in _GAUGES}  # fmt: skip
        counters = {c: CounterMetricFamily(PREFIX + "replica_" + c, f"One replica's {c}.",
                                           labels=labels) for c in _REPLICA_COUNTERS}  # fmt: skip
        for r in live:
            values = [self.model_name, r.replica, r.node]
            up.add_metric(values, 1.0 if r.health is None else 0.0)
            for name, family in (*gauges.items(), *counters.items()):
                family.add_metric(values, getattr(r.stats, name))
        yield from (up, *gauges.values(), *counters.values())
        decisions = CounterMetricFamily(PREFIX + "router_decisions",
                                        "Requests routed by inferd's router, by decision.",
                                        labels=["model_name", "decision"])  # fmt: skip
        for decision, n in sorted(self.decisions.items()):
            decisions.add_metric([self.model_name, decision], n)
        yield decisions

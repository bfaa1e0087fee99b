"""`EfficiencyMeter`: the engine's count of every step's bytes read and FLOPs computed, and, once
the machine's peaks are known, of its MBU and MFU (inferd/step_efficiency.py), always on.

    meter = EfficiencyMeter(traffic, peaks_source)
    meter.observe(record.rows, step_seconds, prefill)     after each step
    meter.snapshot()                                      a StepEfficiency (stats, /metrics)

The cost per step is one pass over the step's rows (a few arithmetic operations per row and
KV group) and two histogram updates: microseconds against a step's milliseconds.

Peaks are never measured here: measuring bandwidth and matrix throughput takes seconds of
every core, which would stall the steps and be disturbed by them. `peaks_source` returns the
peaks another command measured and stored for this machine (`inferd plan`, `inferd bench`;
inferd/plan/machine_peaks.py) or None; the meter asks again at most every
`RETRY_SECONDS` until it gets them, so a server started before the first measurement picks
them up without a restart. Until then MBU and MFU are unknown, bytes and FLOPs still counted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from inferd.profiling.model_traffic import ModelTraffic
from inferd.step_efficiency import (
    UTILIZATION_BUCKETS,
    KindEfficiency,
    PeakRates,
    StepEfficiency,
)
from inferd.step_timing import STEP_KINDS, Histogram

log = logging.getLogger(__name__)

RETRY_SECONDS = 30.0


class _Kind:
    """The running sums of one kind of step."""

    def __init__(self) -> None:
        self.sums = [0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # KindEfficiency's first 8 fields
        self.mbu = Histogram(UTILIZATION_BUCKETS)
        self.mfu = Histogram(UTILIZATION_BUCKETS)

    def snapshot(self) -> KindEfficiency:
        return KindEfficiency(*self.sums, self.mbu.snapshot(), self.mfu.snapshot())


def step_rows(rows: Iterable[Any]) -> Iterable[tuple[int, int, int]]:
    """ScheduledRows (inferd/engine/scheduling/step.py) as ModelTraffic.work reads them: a
    row's drafts are computed too, and each needs its logits row; prompt logprobs need the
    logits of every computed token (the runner computes them besides the sampled row's)."""
    for r in rows:
        drafts = len(r.draft_token_ids)
        n = r.num_new_tokens + drafts
        logits = (1 + drafts if r.needs_logits else 0) + (n if r.prompt_logprobs else 0)
        yield r.num_computed, n, logits


class EfficiencyMeter:
    def __init__(self, traffic: ModelTraffic | None,
                 peaks_source: Callable[[], PeakRates | None] | None = None,
                 clock: Callable[[], float] = time.monotonic):  # fmt: skip
        """`traffic`: None when the model could not be described (the meter then records
        nothing); `peaks_source`: see the module's docstring (None: peaks stay unknown)."""
        self.traffic = traffic
        self._source = peaks_source
        self._clock = clock
        self.peaks: PeakRates | None = None
        self._asked_at: float | None = None
        self._kinds = {k: _Kind() for k in STEP_KINDS}
        self.last: dict[str, float] = {}

    def _peaks(self) -> PeakRates | None:
        if self.peaks is not None or self._source is None:
            return self.peaks
        now = self._clock()
        if self._asked_at is not None and now - self._asked_at < RETRY_SECONDS:
            return None
        self._asked_at = now
        try:
            self.peaks = self._source()
        except Exception:  # a broken cache file must never fail a step
            log.exception("reading the machine's measured peaks failed")
        return self.peaks

    def observe(self, rows: Iterable[Any], seconds: float, prefill: bool) -> None:
        """Count a finished step: its ScheduledRows, its wall time, its kind."""
        if self.traffic is None or seconds <= 0:
            return
        work = self.traffic.work(step_rows(rows))
        kind = self._kinds["prefill" if prefill else "decode"]
        s = kind.sums
        s[0] += 1
        s[1] += seconds
        s[2] += work.weight_bytes
        s[3] += work.kv_bytes
        flops = work.total_flops
        s[4] += flops
        self.last = {"bytes": work.bytes, "weight_bytes": work.weight_bytes,
                     "kv_bytes": work.kv_bytes, "flops": flops, "seconds": seconds}  # fmt: skip
        peaks = self._peaks()
        if peaks is None:
            return
        memory, compute = work.memory_seconds(peaks), work.compute_seconds(peaks)
        if compute is None:
            return
        s[5] += seconds
        s[6] += memory
        s[7] += compute
        kind.mbu.observe(memory / seconds)
        kind.mfu.observe(compute / seconds)
        self.last.update(mbu=memory / seconds, mfu=compute / seconds)

    def snapshot(self) -> StepEfficiency:
        return StepEfficiency({k: v.snapshot() for k, v in self._kinds.items()}, self.peaks,
                              dict(self.last))  # fmt: skip

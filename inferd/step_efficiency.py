"""How close each engine step runs to this machine's limits, as plain data: the bytes it read
(weights, KV cache) and the FLOPs it computed, held against the measured memory bandwidth and
matrix throughput (inferd/plan/machine_peaks.py measures them).

    memory time  = (weight bytes + KV bytes) / peak bandwidth          MBU = memory time / step
    compute time = sum over weight formats f of FLOPs_f / peak FLOP/s_f  MFU = compute time / step

A step whose memory time exceeds its compute time is bandwidth-bound (decode at small batch),
else compute-bound (prefill, large batches); the larger of MBU and MFU says how far from its
roofline the step ran (1.0: at the measured limit; the rest is time the model's kernels spent
below their limit plus the engine's own work around them, inferd/step_timing.py). Each format
has its own peak (a Q4_K block kernel is not a float32 GEMM), so MFU adds each format's time
rather than dividing all FLOPs by one rate; with one format the two are the same.

The engine counts the work (inferd/profiling/model_traffic.py) and fills these records
(inferd/profiling/efficiency_meter.py); the server's /metrics, the dashboard and `inferd bench`
read them. Without measured peaks the bytes and FLOPs are still counted, MBU and MFU are
unknown (None). This module is in the bottom row because all of them read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from inferd.step_timing import STEP_KINDS, Histogram, HistogramData

# Fractions of a limit, per step. Above 1.0 (the last bucket) means the peak was measured low
# (a busy machine while measuring) or the step read less than counted (a cache held it).
UTILIZATION_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


@dataclass(frozen=True)
class PeakRates:
    """The machine's limits, measured (a copy of MachinePeaks' figures as plain data)."""

    machine: str
    memory_bandwidth_bytes_s: float  # sustained read bandwidth
    flops_s: dict[str, float]  # matrix throughput by weight format ("float32", "q4_k", ...)

    def flops_for(self, fmt: str) -> float | None:
        """The peak of `fmt`. NOTE: the engine fills a rate for each of its model's formats,
        a format not measured taking the closest one measured (MachinePeaks.flops_for)."""
        return self.flops_s.get(fmt)


@dataclass(frozen=True)
class StepWork:
    """What one step moved and computed."""

    weight_bytes: float  # weights read (an MoE's routed experts: at most the ones touched)
    kv_bytes: float  # KV cache read: each row's attended context, every layer, keys and values
    # FLOPs by format: the weight matrices' in theirs, attention's under the compute dtype
    flops: dict[str, float]

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes

    @property
    def total_flops(self) -> float:
        return sum(self.flops.values())

    def memory_seconds(self, peaks: PeakRates) -> float:
        """The step's time at the peak bandwidth."""
        return self.bytes / peaks.memory_bandwidth_bytes_s

    def compute_seconds(self, peaks: PeakRates) -> float | None:
        """The step's time at each format's peak; None when a format has no peak at all."""
        total = 0.0
        for fmt, flops in self.flops.items():
            if flops:
                rate = peaks.flops_for(fmt)
                if not rate:
                    return None
                total += flops / rate
        return total


@dataclass(frozen=True)
class KindEfficiency:
    """Cumulative over the steps of one kind (decode or prefill)."""

    steps: int = 0
    seconds: float = 0.0  # their wall time
    weight_bytes: float = 0.0
    kv_bytes: float = 0.0
    flops: float = 0.0
    # Over the steps that ran while the peaks were known: their wall time and their times at
    # the limits; memory_seconds / rated_seconds is the time-weighted MBU.
    rated_seconds: float = 0.0
    memory_seconds: float = 0.0
    compute_seconds: float = 0.0
    mbu: HistogramData = field(default_factory=lambda: _empty())  # one value per rated step
    mfu: HistogramData = field(default_factory=lambda: _empty())

    @property
    def bytes_per_s(self) -> float | None:
        """Achieved bandwidth: bytes read over the steps' wall time."""
        return (self.weight_bytes + self.kv_bytes) / self.seconds if self.seconds else None

    @property
    def mean_mbu(self) -> float | None:
        return self.memory_seconds / self.rated_seconds if self.rated_seconds else None

    @property
    def mean_mfu(self) -> float | None:
        return self.compute_seconds / self.rated_seconds if self.rated_seconds else None

    @property
    def bound(self) -> str | None:
        """Which limit these steps ran nearer: "memory" or "compute" (None: peaks unknown)."""
        if not self.rated_seconds:
            return None
        return "memory" if self.memory_seconds >= self.compute_seconds else "compute"

    def minus(self, earlier: KindEfficiency) -> KindEfficiency:
        return KindEfficiency(*(_sub(a, b) for a, b in zip(_values(self), _values(earlier))))

    def plus(self, other: KindEfficiency) -> KindEfficiency:
        return KindEfficiency(*(_add(a, b) for a, b in zip(_values(self), _values(other))))

    def to_dict(self) -> dict:
        """For reports: totals, achieved rates, the mean utilizations (None: unknown)."""
        return {
            "steps": self.steps,
            "weight_bytes": self.weight_bytes,
            "kv_bytes": self.kv_bytes,
            "flops": self.flops,
            "bytes_per_s": self.bytes_per_s,
            "flops_per_s": self.flops / self.seconds if self.seconds else None,
            "mbu": self.mean_mbu,
            "mfu": self.mean_mfu,
            "bound": self.bound,
        }


def _empty() -> HistogramData:
    return Histogram(UTILIZATION_BUCKETS).snapshot()


def _values(k: KindEfficiency) -> tuple:
    return (k.steps, k.seconds, k.weight_bytes, k.kv_bytes, k.flops, k.rated_seconds,
            k.memory_seconds, k.compute_seconds, k.mbu, k.mfu)  # fmt: skip


def _sub(a, b):
    return a.minus(b) if isinstance(a, HistogramData) else a - b


def _add(a, b):
    return a.plus(b) if isinstance(a, HistogramData) else a + b


@dataclass(frozen=True)
class StepEfficiency:
    """One engine's steps since it started: per kind, and the peaks they were held against
    (None: not measured on this machine yet; see docs/profiling.md)."""

    kinds: dict[str, KindEfficiency] = field(
        default_factory=lambda: {k: KindEfficiency() for k in STEP_KINDS}
    )
    peaks: PeakRates | None = None
    # the last step: bytes, flops, seconds and, with peaks, mbu and mfu (dashboards, logs)
    last: dict[str, float] = field(default_factory=dict)

    def minus(self, earlier: StepEfficiency) -> StepEfficiency:
        kinds = {k: e.minus(earlier.kinds[k]) for k, e in self.kinds.items()}
        return replace(self, kinds=kinds)

    def plus(self, other: StepEfficiency) -> StepEfficiency:
        kinds = {k: e.plus(other.kinds[k]) for k, e in self.kinds.items()}
        return replace(self, kinds=kinds, peaks=self.peaks or other.peaks)

"""Benchmark metrics with vLLM's definitions, computed from per-request timestamps.

Per request (all times in seconds, from one clock):

    TTFT  = first token time − start            (time to first token)
    E2EL  = end time − start                     (end-to-end latency)
    TPOT  = (E2EL − TTFT) / (output tokens − 1)  (time per output token after the first;
                                                  undefined for a single output token)
    ITL   = gaps between consecutive streamed chunks (one value per gap, pooled over requests)

Per run, over a wall-clock duration: request, output-token and total-token (prompt + output)
throughput. Each latency metric is summarised by mean, median, std and percentiles.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from inferd.bench.efficiency import efficiency_dict

DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0)


@dataclass(frozen=True)
class RequestTiming:
    """What one request did, as seen by whoever measured it (client or engine)."""

    # Sent (client) or handed to the system (offline): in the offline modes a whole group is
    # handed over at once, so a request's wait behind others counts, whatever the system.
    start: float
    first_token: float | None  # the first output token became visible
    end: float  # the last output token became visible (vLLM's "latency")
    prompt_tokens: int
    output_tokens: int
    # Times of the streamed chunks, the first token's chunk included; empty when the system
    # does not stream (offline), in which case the request contributes no ITL values.
    chunk_times: tuple[float, ...] = ()
    error: str | None = None

    @property
    def success(self) -> bool:
        return self.error is None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def e2el(self) -> float:
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        """None for fewer than two output tokens: there is no "after the first" to divide.
        NOTE: vLLM leaves such requests out of the TPOT statistics (and counts them as 0 only
        for goodput, which inferd does not report), so `compute_metrics` skips the None."""
        ttft = self.ttft
        if ttft is None or self.output_tokens < 2:
            return None
        return (self.e2el - ttft) / (self.output_tokens - 1)

    @property
    def itl(self) -> list[float]:
        times = self.chunk_times
        return [b - a for a, b in zip(times, times[1:], strict=False)]


@dataclass(frozen=True)
class Stats:
    """Summary of one latency metric in seconds (reports convert to ms)."""

    count: int
    mean: float
    median: float
    std: float  # population std (ddof=0), as numpy's default and vLLM's report
    percentiles: dict[float, float] = field(default_factory=dict)  # 99.0 → p99 value

    @property
    def p99(self) -> float:
        return self.percentiles[99.0]

    def to_dict(self, scale: float = 1.0) -> dict[str, float]:
        out = {
            "count": self.count,
            "mean": self.mean * scale,
            "median": self.median * scale,
            "std": self.std * scale,
        }
        out.update({f"p{p:g}": v * scale for p, v in self.percentiles.items()})
        return out


def summarize(
    values: Iterable[float], percentiles: Sequence[float] = DEFAULT_PERCENTILES
) -> Stats | None:
    """Mean, median, std and percentiles (linear interpolation, numpy's default, as vLLM);
    None when there are no values, so an undefined metric never shows as 0."""
    data = np.asarray(list(values), dtype=np.float64)
    if data.size == 0:
        return None
    wanted = sorted({float(p) for p in (*percentiles, 99.0)})
    return Stats(
        count=int(data.size),
        mean=float(data.mean()),
        median=float(np.median(data)),
        std=float(data.std()),
        percentiles={p: float(np.percentile(data, p)) for p in wanted},
    )


@dataclass(frozen=True)
class BenchMetrics:
    duration: float  # wall-clock seconds the throughputs are measured over
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    ttft: Stats | None
    tpot: Stats | None
    itl: Stats | None
    e2el: Stats | None

    @property
    def request_throughput(self) -> float:
        return self.completed / self.duration if self.duration > 0 else 0.0

    @property
    def output_throughput(self) -> float:
        return self.total_output_tokens / self.duration if self.duration > 0 else 0.0

    @property
    def total_token_throughput(self) -> float:
        total = self.total_input_tokens + self.total_output_tokens
        return total / self.duration if self.duration > 0 else 0.0

    def to_dict(self) -> dict:
        """JSON form: throughputs per second, latencies in milliseconds (vLLM's units)."""
        out: dict = {
            "duration_s": self.duration,
            "completed": self.completed,
            "failed": self.failed,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
        }
        for name in ("ttft", "tpot", "itl", "e2el"):
            stats: Stats | None = getattr(self, name)
            out[f"{name}_ms"] = None if stats is None else stats.to_dict(1000.0)
        return out


def compute_metrics(
    timings: Sequence[RequestTiming],
    duration: float,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> BenchMetrics:
    """Aggregate per-request timings; failed requests count only in `failed` (as vLLM)."""
    ok = [t for t in timings if t.success]
    ttfts = [t.ttft for t in ok if t.ttft is not None]
    tpots = [t.tpot for t in ok if t.tpot is not None]
    itls = [gap for t in ok for gap in t.itl]
    return BenchMetrics(
        duration=duration,
        completed=len(ok),
        failed=len(timings) - len(ok),
        total_input_tokens=sum(t.prompt_tokens for t in ok),
        total_output_tokens=sum(t.output_tokens for t in ok),
        ttft=summarize(ttfts, percentiles),
        tpot=summarize(tpots, percentiles),
        itl=summarize(itls, percentiles),
        e2el=summarize([t.e2el for t in ok], percentiles),
    )


@dataclass
class SystemResult:
    """One system's figures for one benchmark run."""

    system: str
    metrics: BenchMetrics
    load_seconds: float | None = None
    info: dict[str, str] = field(default_factory=dict)
    iteration: Stats | None = None  # latency mode: seconds per batch
    prefill_throughput: float | None = None  # prompt tok/s until first tokens (latency mode)
    # Latency mode: median over iterations of the iteration's output tok/s. Unlike the pooled
    # figure, one iteration slowed by a neighbour's job does not move it.
    iteration_output_throughput: float | None = None
    notes: list[str] = field(default_factory=list)
    # inferd: mean time per step phase over the measured part, per kind of step
    # (inferd/step_timing.py PhaseBreakdown); empty for peers.
    step_phases: list = field(default_factory=list)
    # inferd: bytes read, FLOPs, MBU and MFU over the same steps (inferd/step_efficiency.py
    # StepEfficiency); None for peers.
    step_efficiency: object | None = None
    # The measured requests, for plots of their distributions (bench/plots.py); not in to_dict.
    timings: list[RequestTiming] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "system": self.system,
            **self.metrics.to_dict(),
            "iteration_latency_s": None if self.iteration is None else self.iteration.to_dict(),
            "prefill_throughput": self.prefill_throughput,
            "iteration_output_throughput": self.iteration_output_throughput,
            "load_seconds": self.load_seconds,
            "info": self.info,
            "notes": self.notes,
            "step_phases": [b.to_dict() for b in self.step_phases],
            "step_efficiency": efficiency_dict(self.step_efficiency),
        }


def count_mismatches(timings: Sequence[RequestTiming], wanted: Sequence[int]) -> list[str]:
    """Notes for requests that produced other than the asked number of tokens: such a run is
    not comparable (a system that stops early looks faster), so it is flagged in the report."""
    bad = sum(1 for t, n in zip(timings, wanted, strict=True) if t.success and t.output_tokens != n)
    return [f"{bad} request(s) produced a different number of tokens than asked"] if bad else []

"""This machine's limits, measured with inferd's own kernels: the read bandwidth a decode step
can reach (every weight read once per token) and the matrix throughput of each weight format
(the rate a prefill chunk can reach). Both are what a roofline divides by; `inferd plan` uses
them for `--hardware this`, and live efficiency (MBU / MFU) divides a step's achieved rates by
them.

Measured once per machine (a few seconds) and kept as JSON in inferd's cache folder, keyed by
the CPU model, its feature flags and the core count, so a different machine (or a VM resized to
other cores) measures again. `machine_peaks(refresh=True)` measures anew.

How: bandwidth is the sum of a buffer eight times the last-level cache of this CPU (256 MiB),
read by every thread, the fastest of several passes; matrix throughput is kernel_rates.py's
(inferd's own block kernel for each GGUF format, PyTorch's `F.linear` for dense dtypes, at 1 to
256 rows), one thread's times the threads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import inferd.cache as cache
import inferd.cpu_info as cpu_info

log = logging.getLogger(__name__)

CACHE_VERSION = 2  # bump when the way of measuring changes: older entries are measured again
BANDWIDTH_BUFFER_BYTES = 256 << 20
SAMPLE_S = 0.01  # a timed sample lasts several of the scheduler's time slices


@dataclass(frozen=True)
class MachinePeaks:
    """Measured (or, for a named profile, published) limits of one machine or device."""

    name: str  # "this machine: AMD EPYC, 2 cores, avx2 fma f16c" or a profile's name
    cores: int
    memory_bytes: int
    memory_bandwidth_bytes_s: float  # sustained read bandwidth
    flops_s: dict[str, float]  # matrix throughput by weight format ("float32", "q4_k", ...)
    measured_at: str = ""  # UTC time of the measurement ("" for a published profile)
    threads: int = 0  # threads the measurement ran with (0: not measured here)
    # format → {rows (as a string: JSON keys) → matrix throughput at that many rows}
    flops_s_by_rows: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)

    def flops_at(self, weight_format: str, rows: int) -> float:
        """Matrix throughput of `weight_format` for a product of `rows` rows: the measured
        curve, interpolated in log(rows) and flat beyond its ends; the peak without a curve."""
        curve = self.flops_s_by_rows.get(weight_format.lower())
        if not curve:
            return self.flops_for(weight_format)
        points = sorted((int(r), v) for r, v in curve.items())
        if rows <= points[0][0]:
            return points[0][1]
        for (r0, v0), (r1, v1) in zip(points, points[1:], strict=False):
            if rows <= r1:
                t = (math.log(rows) - math.log(r0)) / (math.log(r1) - math.log(r0))
                return v0 + t * (v1 - v0)
        return points[-1][1]

    def flops_for(self, weight_format: str) -> float:
        """The matrix throughput of `weight_format`; a format not measured falls back to the
        closest kind measured (another block format, else float32)."""
        key = weight_format.lower()
        if key in self.flops_s:
            return self.flops_s[key]
        blocks = [v for k, v in self.flops_s.items() if k.startswith(("q", "iq"))]
        if key.startswith(("q", "iq")) and blocks:
            return statistics.median(blocks)
        return self.flops_s.get("float32") or max(self.flops_s.values())

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> MachinePeaks:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def machine_key() -> str:
    """What identifies this machine's peaks: CPU model, its flags, the core count (and the
    threads inferd runs with, where they are not the cores: OMP_NUM_THREADS=1 measures a
    one-thread machine)."""
    import torch

    flags = " ".join(sorted(cpu_info.cpu_flags()))
    cores, threads = os.cpu_count(), torch.get_num_threads()
    text = f"v{CACHE_VERSION}|{cpu_info.cpu_model()}|{flags}|{cores}"
    if threads != cores:
        text += f"|{threads} threads"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_path(kind: str = "machine_peaks"):
    """The JSON file of `kind` (peaks, or the fitted step model beside them) for this machine."""
    return cache.cache_dir() / "plan" / f"{kind}-{machine_key()}.json"


def describe_this_machine() -> str:
    flags = cpu_info.cpu_flags()
    shown = [f for f in cpu_info.NOTABLE_FEATURES if f in flags]
    cores = os.cpu_count() or 1
    return f"this machine: {cpu_info.cpu_model()}, {cores} cores, {' '.join(shown) or 'no SIMD'}"


def _best_rate(work: float, fn: Callable[[], object], seconds: float, least: int = 3) -> float:
    """`work` per second of `fn` at its best: samples of enough calls to last SAMPLE_S each,
    the fastest sample over about `seconds` (at least `least` samples).

    The fastest, and a sample's time the lesser of its wall-clock time and the process's CPU
    time over the threads: on a machine to itself these agree with the median wall-clock time,
    and where other processes share the cores (a thread descheduled for a time slice stalls
    its peers at the next barrier) they still measure the machine, not its load of the moment.
    A peak is a ceiling: the roofline divides by it."""
    import torch

    threads = max(torch.get_num_threads(), 1)
    t0 = time.perf_counter()
    fn()  # warm: first touch, caches, thread pools; and how long one call takes
    calls = max(1, min(1000, int(SAMPLE_S / max(time.perf_counter() - t0, 1e-6))))
    best = math.inf
    start, samples = time.perf_counter(), 0
    while samples < least or (time.perf_counter() - start < seconds and samples < 100):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(calls):
            fn()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        best = min(best, (min(wall, cpu / threads) if cpu > 0 else wall) / calls)
        samples += 1
    return work / best


def measure_bandwidth(seconds: float) -> float:
    import torch

    buffer = torch.ones(BANDWIDTH_BUFFER_BYTES // 4, dtype=torch.float32)
    return _best_rate(BANDWIDTH_BUFFER_BYTES, buffer.sum, seconds, least=5)


def measure_machine_peaks(seconds: float = 2.0) -> MachinePeaks:
    """Measure this machine now (about `seconds` of measuring, plus a subprocess's start)."""
    import torch

    from inferd.memory.measure import local_device_memory
    from inferd.plan.kernel_rates import single_thread_rates

    threads = max(torch.get_num_threads(), 1)
    bandwidth = measure_bandwidth(seconds / 4)
    # NOTE: one thread's rates, times the threads: CPU time of one thread is what a shared
    # machine still measures repeatably (the kernels split rows evenly over threads, so a
    # compute-bound product scales with them); the memory ceiling is `bandwidth`, measured
    # with every thread.
    rates = single_thread_rates(seconds * 3 / 4)
    curves = {fmt: {rows: rate * threads for rows, rate in curve.items()}
              for fmt, curve in rates["by_rows"].items()}  # fmt: skip
    flops = {fmt: rate * threads for fmt, rate in rates["peak"].items()}
    for fmt, curve in curves.items():
        flops[fmt] = max(flops.get(fmt, 0.0), *curve.values())
    return MachinePeaks(
        name=describe_this_machine(),
        cores=os.cpu_count() or 1,
        memory_bytes=int(local_device_memory("cpu")),
        memory_bandwidth_bytes_s=bandwidth,
        flops_s=flops,
        measured_at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        threads=threads,
        flops_s_by_rows=curves,
    )


def load_cached(kind: str = "machine_peaks") -> dict | None:
    """The cached JSON of `kind` for this machine, or None (absent or damaged: measure)."""
    path = cache_path(kind)
    if not cache.verified(path):
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        cache.discard(path, "not JSON")
        return None


def store_cached(kind: str, data: dict) -> None:
    try:
        cache.publish_text(cache_path(kind), json.dumps(data, indent=1) + "\n")
    except OSError as e:  # a read-only cache: measured again next time
        log.warning("could not keep %s in the cache: %s", kind, e)


def machine_peaks(refresh: bool = False) -> MachinePeaks:
    """This machine's peaks: measured once, then read from the cache."""
    if not refresh:
        data = load_cached()
        if data is not None:
            try:
                return MachinePeaks.from_dict(data)
            except TypeError:
                cache.discard(cache_path(), "not a MachinePeaks record")
    log.info("measuring this machine's bandwidth and matrix throughput (a few seconds)")
    peaks = measure_machine_peaks()
    store_cached("machine_peaks", peaks.to_dict())
    return peaks

"""This machine's limits, measured with inferd's own kernels: the read bandwidth a decode step
can reach (every weight read once per token) and the matrix throughput of each weight format
(the rate a prefill chunk can reach). Both are what a roofline divides by; `inferd plan` uses
them for `--hardware this`, and live efficiency (MBU / MFU) divides a step's achieved rates by
them.

Measured once per machine (a few seconds) and kept as JSON in inferd's cache folder, keyed by
the CPU model, its feature flags and the core count, so a different machine (or a VM resized to
other cores) measures again. `machine_peaks(refresh=True)` measures anew.

How: bandwidth is the sum of a buffer eight times the largest last-level cache found on
CPUs of this kind (256 MiB), read by every thread, median of several passes; matrix throughput is
a product of 64 rows by a 2048 x 2048 matrix, float32/bfloat16/float16 by PyTorch's `F.linear`
(what the engine runs for dense weights) and each GGUF block format by inferd's block kernel
(`BlockWeight`, what the default mode runs for a GGUF file's blocks), with random weights.
Wall-clock time with every thread: the peak a step could reach, on a machine to itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import inferd.cache as cache
import inferd.cpu_info as cpu_info

log = logging.getLogger(__name__)

CACHE_VERSION = 1  # bump when the way of measuring changes: older entries are measured again
BANDWIDTH_BUFFER_BYTES = 256 << 20
GEMM_ROWS, GEMM_SIZE = 64, 2048  # M x K @ K x N: compute-bound for every format here
DENSE_FORMATS = ("float32", "bfloat16", "float16")
# GGUF block formats the block kernel runs: (ggml type, byte offsets of the fp16 scales in a
# block of the file's layout), so that random blocks hold finite scales.
BLOCK_FORMATS: dict[str, tuple[int, tuple[int, ...]]] = {
    "q8_0": (8, (0,)),
    "q4_0": (2, (0,)),
    "q4_k": (12, (0, 2)),
    "q5_k": (13, (0, 2)),
    "q6_k": (14, (208,)),
}


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
    """What identifies this machine's peaks: CPU model, its flags, the core count."""
    flags = " ".join(sorted(cpu_info.cpu_flags()))
    text = f"v{CACHE_VERSION}|{cpu_info.cpu_model()}|{flags}|{os.cpu_count()}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_path(kind: str = "machine_peaks"):
    """The JSON file of `kind` (peaks, or the fitted step model beside them) for this machine."""
    return cache.cache_dir() / "plan" / f"{kind}-{machine_key()}.json"


def describe_this_machine() -> str:
    flags = cpu_info.cpu_flags()
    shown = [f for f in cpu_info.NOTABLE_FEATURES if f in flags]
    cores = os.cpu_count() or 1
    return f"this machine: {cpu_info.cpu_model()}, {cores} cores, {' '.join(shown) or 'no SIMD'}"


def _median_rate(work: float, fn: Callable[[], object], seconds: float, least: int = 3) -> float:
    """`work` per second of `fn`, median over runs filling about `seconds` (at least `least`)."""
    fn()  # warm: first touch, caches, thread pools
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < least or (time.perf_counter() - start < seconds and len(times) < 200):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return work / statistics.median(times)


def measure_bandwidth(seconds: float) -> float:
    import torch

    buffer = torch.ones(BANDWIDTH_BUFFER_BYTES // 4, dtype=torch.float32)
    return _median_rate(BANDWIDTH_BUFFER_BYTES, buffer.sum, seconds, least=5)


def _dense_flops(dtype_name: str, seconds: float) -> float:
    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, dtype_name)
    x = torch.randn(GEMM_ROWS, GEMM_SIZE).to(dtype)
    w = (torch.randn(GEMM_SIZE, GEMM_SIZE) * 0.02).to(dtype)
    return _median_rate(2.0 * GEMM_ROWS * GEMM_SIZE * GEMM_SIZE, lambda: F.linear(x, w), seconds)


def random_block_weight(weight_format: str, rows: int, cols: int):
    """A BlockWeight of `weight_format` with random integers and finite scales."""
    import numpy as np

    from inferd.layers.gguf_blocks import BlockWeight
    from inferd.loader import gguf_quants as gq

    ggml_type = BLOCK_FORMATS[weight_format][0]
    per_block, nbytes = gq.BLOCK_LAYOUT[ggml_type]
    count = rows * cols // per_block
    raw = np.random.default_rng(0).integers(0, 256, (count, nbytes), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    for at in BLOCK_FORMATS[weight_format][1]:
        raw[:, at : at + 2] = scale
    return BlockWeight(*gq.unpack(raw, ggml_type, (rows, cols)))


def _block_flops(weight_format: str, seconds: float) -> float:
    import torch

    w = random_block_weight(weight_format, GEMM_SIZE, GEMM_SIZE)
    x = torch.randn(GEMM_ROWS, GEMM_SIZE)
    return _median_rate(2.0 * GEMM_ROWS * GEMM_SIZE * GEMM_SIZE, lambda: w(x), seconds)


def measure_machine_peaks(seconds: float = 2.0) -> MachinePeaks:
    """Measure this machine now (about `seconds`, spread over the figures)."""
    import torch

    from inferd.cpu_kernels import kernels_available
    from inferd.memory.measure import local_device_memory

    formats = list(DENSE_FORMATS) + (list(BLOCK_FORMATS) if kernels_available() else [])
    share = seconds / (2 + len(formats))  # the bandwidth gets two shares: it matters most
    bandwidth = measure_bandwidth(2 * share)
    flops: dict[str, float] = {}
    for name in formats:
        rate = _dense_flops(name, share) if name in DENSE_FORMATS else _block_flops(name, share)
        flops[name] = rate
    return MachinePeaks(
        name=describe_this_machine(),
        cores=os.cpu_count() or 1,
        memory_bytes=int(local_device_memory("cpu")),
        memory_bandwidth_bytes_s=bandwidth,
        flops_s=flops,
        measured_at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        threads=torch.get_num_threads(),
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

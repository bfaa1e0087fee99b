"""One thread's matrix throughput with inferd's kernels, per weight format and rows of a step.

Run in a subprocess with one OpenMP and one PyTorch thread (`single_thread_rates`), timed by the
thread's own CPU time: a figure that other processes on the cores hardly move (a product of a few
rows lasts a fraction of a millisecond, and with several threads a scheduler's time slice taken
from one of them stalls the others at the next barrier).

Each product multiplies rows by a 2048 x 2048 matrix with random weights: a GGUF block format by
inferd's block kernel (`BlockWeight`, what the default mode runs for a GGUF file's blocks); a
dense dtype by PyTorch's `F.linear` (what the engine runs for dense weights). The matrix fits the
caches, so even one row is not bound by memory here: bandwidth is the other ceiling, measured
apart (machine_peaks.py). A decode step of a few sequences multiplies a few rows and runs the
kernel below its peak: hence the curve over rows.

    python -m inferd.plan.kernel_rates 2.0     # prints the rates as JSON (the parent's input)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

GEMM_SIZE = 2048
CURVE_ROWS = (1, 4, 16, 64, 256)
DENSE_FORMATS = ("float32", "bfloat16", "float16")
# GGUF block formats the block kernel runs: (ggml type, byte offsets of the fp16 scales in a
# block of the file's layout), so that random blocks hold finite scales.
BLOCK_FORMATS: dict[str, tuple[int, tuple[int, ...]]] = {
    "q8_0": (8, (0,)),
    "q4_0": (2, (0,)),
    "q4_1": (3, (0, 2)),
    "q5_0": (6, (0,)),
    "q4_k": (12, (0, 2)),
    "q5_k": (13, (0, 2)),
    "q6_k": (14, (208,)),
}
SAMPLE_S = 0.005  # CPU seconds of one timed sample (several calls of a short product)


def random_block_weight(weight_format: str, rows: int, cols: int):
    """A BlockWeight of `weight_format` with random integers and finite scales."""
    import numpy as np

    from inferd.layers.gguf_blocks import BlockWeight
    from inferd.loader import gguf_quants as gq

    ggml_type, scales = BLOCK_FORMATS[weight_format]
    per_block, nbytes = gq.BLOCK_LAYOUT[ggml_type]
    count = rows * cols // per_block
    raw = np.random.default_rng(0).integers(0, 256, (count, nbytes), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    for at in scales:
        raw[:, at : at + 2] = scale
    return BlockWeight(*gq.unpack(raw, ggml_type, (rows, cols)))


def _best_rate(work: float, fn, seconds: float) -> float:
    """`work` per CPU second of this thread, the fastest of samples filling `seconds`."""
    t0 = time.thread_time()
    fn()  # warm, and how long one call takes
    calls = max(1, min(1000, int(SAMPLE_S / max(time.thread_time() - t0, 1e-6))))
    best, spent = float("inf"), 0.0
    while spent < seconds or best == float("inf"):
        t0 = time.thread_time()
        for _ in range(calls):
            fn()
        took = time.thread_time() - t0
        spent += took
        if took > 0:
            best = min(best, took / calls)
    return work / best


def measure(seconds: float) -> dict:
    """{"peak": {format: rate at 64 rows}, "by_rows": {format: {rows: rate}}} for one thread."""
    import torch
    import torch.nn.functional as F

    from inferd.cpu_kernels import kernels_available

    torch.set_num_threads(1)
    blocks = list(BLOCK_FORMATS) if kernels_available() else []
    share = seconds / (len(DENSE_FORMATS) + 1 + len(blocks))
    dense = {n: (torch.randn(GEMM_SIZE, GEMM_SIZE) * 0.02).to(getattr(torch, n))
             for n in DENSE_FORMATS}  # fmt: skip

    def dense_rate(name: str, rows: int, budget: float) -> float:
        x = torch.randn(rows, GEMM_SIZE).to(dense[name].dtype)
        return _best_rate(2.0 * rows * GEMM_SIZE**2, lambda: F.linear(x, dense[name]), budget)

    peak = {n: dense_rate(n, 64, share) for n in DENSE_FORMATS}
    by_rows = {"float32": {str(r): dense_rate("float32", r, share / len(CURVE_ROWS))
                           for r in CURVE_ROWS}}  # fmt: skip
    for name in blocks:
        w = random_block_weight(name, GEMM_SIZE, GEMM_SIZE)
        curve = {}
        for rows in CURVE_ROWS:
            x = torch.randn(rows, GEMM_SIZE)
            budget = share / len(CURVE_ROWS)
            curve[str(rows)] = _best_rate(2.0 * rows * GEMM_SIZE**2, lambda x=x, w=w: w(x), budget)
        by_rows[name] = curve
    return {"peak": peak, "by_rows": by_rows}


def single_thread_rates(seconds: float) -> dict:
    """`measure` in a subprocess with one OpenMP and one PyTorch thread."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "inferd.plan.kernel_rates", str(seconds)],
                          env=env, capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"measuring the kernels' rates failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(measure(float(sys.argv[1]) if len(sys.argv) > 1 else 2.0)))

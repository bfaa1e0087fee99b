"""The machine's memory read bandwidth as a decode step sees it: the sum of a buffer far larger
than the caches, read by every thread (torch's reduction, one pass), median of repeated runs.

    python scripts/read_bandwidth.py [--threads 2] [--gib 2]

Decode reads every weight once per token, so tok/s x bytes read per token over this figure is
the share of the bandwidth a decode achieves (docs/gguf.md).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--gib", type=float, default=2.0, help="buffer size (default 2 GiB)")
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    buffer = torch.ones(int(args.gib * 2**30) // 4, dtype=torch.float32)
    rates = []
    for _ in range(args.runs + 2):
        t0 = time.perf_counter()
        buffer.sum()
        rates.append(buffer.numel() * 4 / (time.perf_counter() - t0) / 1e9)
    rates = rates[2:]  # the first runs fault pages in and warm up
    print(
        f"read bandwidth, {args.threads} threads, {args.gib:g} GiB buffer: median "
        f"{statistics.median(rates):.1f} GB/s (min {min(rates):.1f}, max {max(rates):.1f})"
    )


if __name__ == "__main__":
    main()

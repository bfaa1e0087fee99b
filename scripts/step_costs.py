"""CPU time of model steps of the embedded model, by kind and size: decode steps of 1-16
sequences (200 cached tokens each) and prefill chunks, through the engine's runner, one thread,
medians. CPU time with one thread is what a shared machine still measures repeatably; wall
clock with two threads is what users see (`inferd bench`).

    python scripts/step_costs.py                      # the default mode
    python scripts/step_costs.py --dtype bfloat16 --deterministic
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from inferd import LLM
from inferd.engine.execution.runner import SequenceStep

BLOCKS = 48  # per sequence: 768 tokens


def cpu_ms(runner, steps, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time()
        runner.execute(steps)
        times.append(time.process_time() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    torch.set_num_threads(1)
    flags = {"deterministic": True} if args.deterministic else {}
    llm = LLM(dtype=args.dtype, kv_cache_memory=1 << 30, max_num_batched_tokens=1024, **flags)
    runner = llm.engine.runner
    groups = len(runner.kv_caches)
    tables = [[list(range(1 + BLOCKS * i, 1 + BLOCKS * (i + 1)))] * groups for i in range(16)]
    for table in tables:
        runner.clear_blocks(table)
        runner.execute([SequenceStep(list(range(1000, 1200)), 0, table)])
    for n in (1, 4, 8, 16):
        decode = [SequenceStep([5], 200, tables[i]) for i in range(n)]
        print(f"decode, {n:3d} sequences: {cpu_ms(runner, decode, args.repeats):8.1f} ms")
    for n in (128, 512):
        chunk = [SequenceStep(list(range(2000, 2000 + n)), 200, tables[0])]
        print(f"prefill chunk of {n} tokens: {cpu_ms(runner, chunk, 5):8.1f} ms")


if __name__ == "__main__":
    main()

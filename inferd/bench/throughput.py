"""Offline throughput: the whole workload handed to a system at once, timed by the wall clock.

For inferd that is one `LLM.generate` call with every request (greedy, EOS ignored, max_tokens
= the request's output length), as vLLM's `benchmark_throughput`; each peer serves the same
list its own way (see `peers.py`). Throughputs divide by the wall-clock time of the call.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from inferd.bench.metrics import (
    DEFAULT_PERCENTILES,
    RequestTiming,
    SystemResult,
    compute_metrics,
    count_mismatches,
)
from inferd.bench.systems import (
    System,
    begin_measured,
    measured_efficiency,
    step_breakdown,
    warm_up,
)
from inferd.bench.workload import BenchRequest, WorkloadSpec, make_requests


def round_workloads(
    spec: WorkloadSpec, vocab_ids: np.ndarray, rounds: int, tokenizer=None
) -> list[list[BenchRequest]]:
    """One request list per round, round k drawn with seed + k: a round that repeated the
    previous prompts would be served from inferd's prefix cache. The copy dataset needs the
    model's `tokenizer`."""
    if rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {rounds}")
    return [
        make_requests(replace(spec, seed=spec.seed + k), vocab_ids, tokenizer)
        for k in range(rounds)
    ]


def run_throughput(
    systems: Sequence[System],
    rounds: Sequence[Sequence[BenchRequest]],
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> list[SystemResult]:
    """Each round runs its workload on every system in turn; with several rounds the systems
    alternate, so a busy spell on a shared machine is spread over all of them. Figures pool
    every round: throughput = all tokens / all rounds' time."""
    some_id = rounds[0][0].prompt_token_ids[0]
    for system in systems:
        warm_up(system, some_id)
    seconds = [0.0 for _ in systems]
    timings: list[list[RequestTiming]] = [[] for _ in systems]
    begin_measured(systems)
    for requests in rounds:
        for i, system in enumerate(systems):
            t0 = time.perf_counter()
            timings[i] += system.generate(requests)
            seconds[i] += time.perf_counter() - t0
    wanted = [r.output_len for requests in rounds for r in requests]
    phases = [step_breakdown(system) for system in systems]
    return [
        SystemResult(
            system=system.name,
            metrics=compute_metrics(timings[i], seconds[i], percentiles),
            load_seconds=system.load_seconds,
            info=dict(system.info),
            notes=count_mismatches(timings[i], wanted),
            step_phases=phases[i],
            step_efficiency=measured_efficiency(system),
            timings=timings[i],
        )
        for i, system in enumerate(systems)
    ]

"""Latency: one batch of `batch_size` requests run to completion, `num_iters` times after
`num_iters_warmup` untimed runs (vLLM's `benchmark_latency`), for every system at once.

Each iteration gets fresh random prompts of the same lengths (seed + iteration): repeating the
very same prompts would let inferd's prefix cache and llama.cpp's prompt reuse skip the prefill
from the second iteration on, and measure a cache hit instead of the workload.
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
    summarize,
)
from inferd.bench.systems import System, begin_measured, measured_efficiency, step_breakdown
from inferd.bench.workload import BenchRequest, WorkloadSpec, make_requests


def latency_batches(
    spec: WorkloadSpec, vocab_ids: np.ndarray, num_warmup: int, num_iters: int, tokenizer=None
) -> tuple[list[list[BenchRequest]], list[list[BenchRequest]]]:
    """(warm-up batches, measured batches); `spec.num_prompts` is the batch size. The copy
    dataset needs the model's `tokenizer`."""
    if num_iters < 1 or num_warmup < 0:
        raise ValueError(
            f"need num_iters >= 1 and num_iters_warmup >= 0, got {num_iters}, {num_warmup}"
        )
    batches = [
        make_requests(replace(spec, seed=spec.seed + i), vocab_ids, tokenizer)
        for i in range(num_warmup + num_iters)
    ]
    return batches[:num_warmup], batches[num_warmup:]


def prefill_throughput(timings: Sequence[RequestTiming]) -> float | None:
    """Prompt tokens per second until every request of the batch has its first token; for one
    request, prompt length / TTFT."""
    firsts = [t.first_token for t in timings]
    if not timings or any(f is None for f in firsts):
        return None
    elapsed = max(firsts) - min(t.start for t in timings)
    return sum(t.prompt_tokens for t in timings) / elapsed if elapsed > 0 else None


def run_latency(
    systems: Sequence[System],
    warmup: Sequence[Sequence[BenchRequest]],
    batches: Sequence[Sequence[BenchRequest]],
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> list[SystemResult]:
    """Iterations alternate between the systems (inferd's iteration 1, the peer's iteration 1,
    inferd's iteration 2, ...), so load that comes and goes on a shared machine lands on all of
    them alike instead of on whichever ran during the busy minute."""
    for system in systems:
        for batch in warmup:
            system.generate(batch)
    seconds: list[list[float]] = [[] for _ in systems]
    timings: list[list[RequestTiming]] = [[] for _ in systems]
    prefill: list[list[float]] = [[] for _ in systems]
    output: list[list[float]] = [[] for _ in systems]
    begin_measured(systems)
    for batch in batches:
        for i, system in enumerate(systems):
            t0 = time.perf_counter()
            got = system.generate(batch)
            elapsed = time.perf_counter() - t0
            if getattr(system, "times_itself", False):
                # NOTE: its timings are durations it measured itself (llama-bench), outside of
                # which it starts a process and loads the model: its iteration is their span
                elapsed = max(t.end for t in got) - min(t.start for t in got)
            seconds[i].append(elapsed)
            output[i].append(sum(t.output_tokens for t in got) / seconds[i][-1])
            timings[i] += got
            rate = prefill_throughput(got)
            if rate is not None:
                prefill[i].append(rate)
    wanted = [r.output_len for batch in batches for r in batch]
    phases = [step_breakdown(system) for system in systems]
    return [
        SystemResult(
            system=system.name,
            # Throughputs over the measured iterations only (warm-up excluded).
            metrics=compute_metrics(timings[i], sum(seconds[i]), percentiles),
            load_seconds=system.load_seconds,
            info=dict(system.info),
            iteration=summarize(seconds[i], percentiles),
            prefill_throughput=float(np.median(prefill[i])) if prefill[i] else None,
            iteration_output_throughput=float(np.median(output[i])),
            notes=count_mismatches(timings[i], wanted),
            step_phases=phases[i],
            step_efficiency=measured_efficiency(system),
            timings=timings[i],
        )
        for i, system in enumerate(systems)
    ]

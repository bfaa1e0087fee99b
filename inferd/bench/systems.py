"""What a benchmarked system must do, and inferd's own implementation of it.

A system is loaded once, then `generate(requests)` runs a group of requests to completion
(greedy, EOS ignored, exactly `output_len` tokens each) and returns one `RequestTiming` per
request. How the group is run (all at once, one after another, one padded batch) is the
system's own way of serving it; the benchmark modes only time and aggregate.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import fields
from typing import Protocol

from inferd.bench.metrics import RequestTiming
from inferd.bench.workload import BenchRequest


class System(Protocol):
    name: str
    load_seconds: float
    info: dict[str, str]  # dtype, threads, how requests are run: printed and saved with results

    def generate(self, requests: Sequence[BenchRequest]) -> list[RequestTiming]: ...

    def close(self) -> None: ...


def warm_up(system: System, vocab_id: int) -> None:
    """One tiny untimed request, so first-call costs (allocator growth, lazy kernels) are not
    charged to whichever request happens to run first."""
    system.generate([BenchRequest([vocab_id] * 8, 4)])


class InferdSystem:
    """inferd's offline API: every request handed to `LLM.generate` at once, so the scheduler
    batches them (continuous batching, chunked prefill)."""

    name = "inferd"

    def __init__(self, config) -> None:
        import torch

        from inferd.llm import LLM

        t0 = time.perf_counter()
        self.llm = LLM(**{f.name: getattr(config, f.name) for f in fields(config)})
        self.load_seconds = time.perf_counter() - t0
        setup = self.llm.engine.setup
        self.info = {
            "dtype": str(setup.dtype).removeprefix("torch."),
            "device": str(setup.device),
            "threads": str(torch.get_num_threads()),
            "batching": f"continuous, max_num_seqs={setup.max_num_seqs}, "
            f"max_num_batched_tokens={setup.max_num_batched_tokens}",
        }

    @property
    def model_path(self) -> str:
        return str(self.llm.engine.setup.checkpoint.path)

    @property
    def tokenizer(self):
        return self.llm.engine.tokenizer

    def sampling_params(self, request: BenchRequest):
        from inferd.sampling_params import SamplingParams

        return SamplingParams(temperature=0.0, max_tokens=request.output_len, ignore_eos=True)

    def generate(self, requests: Sequence[BenchRequest]) -> list[RequestTiming]:
        params = [self.sampling_params(r) for r in requests]
        prompts = [r.prompt_token_ids for r in requests]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        timings = []
        for out in outs:
            m = out.metrics
            n = len(out.outputs[0].token_ids)
            # NOTE: the engine's clock is time.monotonic; every field of one request uses it.
            end = m.last_token_time if m.last_token_time is not None else m.finished_time
            timings.append(
                RequestTiming(
                    start=m.arrival_time,
                    first_token=m.first_token_time,
                    end=end,
                    prompt_tokens=len(out.prompt_token_ids),
                    output_tokens=n,
                    error=out.error,
                )
            )
        return timings

    def close(self) -> None:
        self.llm = None

"""What a benchmarked system must do, and inferd's own implementation of it.

A system is loaded once, then `generate(requests)` runs a group of requests to completion
(greedy unless an inferd system was given a temperature; EOS ignored, exactly `output_len`
tokens each) and returns one `RequestTiming` per request. How the group is run (all at once,
one after another, one padded batch) is the system's own way of serving it; the benchmark modes
only time and aggregate.
"""

from __future__ import annotations

import json
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


def begin_measured(systems: Sequence[System]) -> None:
    """The measured part of a run starts (warm-up done): systems that report where their steps'
    time goes (inferd) take their starting point now."""
    for system in systems:
        begin = getattr(system, "begin_measured", None)
        if begin is not None:
            begin()


def step_breakdown(system: System) -> list:
    """The system's mean step phases over the measured part (PhaseBreakdown per kind of step,
    inferd/step_timing.py); [] for systems that do not report them."""
    end = getattr(system, "end_measured", None)
    return end() if end is not None else []


def measured_efficiency(system: System):
    """The system's bytes read, FLOPs, MBU and MFU over the measured part (a StepEfficiency,
    inferd/step_efficiency.py), after `step_breakdown`; None for systems that do not count."""
    return getattr(system, "measured_efficiency", None)


def warm_up(system: System, vocab_id: int) -> None:
    """One tiny untimed request, so first-call costs (allocator growth, lazy kernels) are not
    charged to whichever request happens to run first."""
    system.generate([BenchRequest([vocab_id] * 8, 4)])


class InferdSystem:
    """inferd's offline API: every request handed to `LLM.generate` at once, so the scheduler
    batches them (continuous batching, chunked prefill). `temperature` > 0 samples (unseeded)
    instead of decoding greedily."""

    def __init__(self, config, name: str = "inferd", temperature: float = 0.0,
                 profile_dir: str | None = None) -> None:  # fmt: skip
        """`profile_dir`: trace the measured part of the run there (docs/profiling.md)."""
        import torch

        from inferd.llm import LLM

        self.name, self.temperature = name, temperature
        self.profile_dir, self.trace = profile_dir, None
        # Step phases of this system's own measured `generate` calls: one engine may serve two
        # systems (bench/constrained.py), whose steps must not be mixed.
        self._measuring, self._spent = False, None
        self._counted = self.measured_efficiency = None  # the same span's bytes and FLOPs

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
        if temperature > 0:
            self.info["sampling"] = f"temperature {temperature:g}"
        speculation = self.llm.engine.speculation
        if speculation is not None:
            self.info["speculative decoding"] = json.dumps(speculation.config.to_dict())

    @property
    def model_path(self) -> str:
        return str(self.llm.engine.setup.checkpoint.path)

    @property
    def tokenizer(self):
        return self.llm.engine.tokenizer

    def sampling_params(self, request: BenchRequest):
        from inferd.sampling_params import SamplingParams

        return SamplingParams(temperature=self.temperature, max_tokens=request.output_len,
                              ignore_eos=True)  # fmt: skip

    def prompt(self, request: BenchRequest) -> list[int] | dict:
        return request.prompt_token_ids

    def generate(self, requests: Sequence[BenchRequest]) -> list[RequestTiming]:
        params = [self.sampling_params(r) for r in requests]
        prompts = [self.prompt(r) for r in requests]
        before = self.llm.step_timing() if self._measuring else None
        counted = self.llm.step_efficiency() if self._measuring else None
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        if before is not None:
            spent = self.llm.step_timing().minus(before)
            self._spent = spent if self._spent is None else self._spent.plus(spent)
        if counted is not None:
            span = self.llm.step_efficiency().minus(counted)
            self._counted = span if self._counted is None else self._counted.plus(span)
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
        self._note_speculation()
        return timings

    def begin_measured(self) -> None:
        self._measuring, self._spent = True, None
        self._counted = self.measured_efficiency = None
        if self.profile_dir:
            self.llm.start_profile(self.profile_dir)

    def end_measured(self) -> list:
        """Mean step phases of the generate calls since `begin_measured`, per kind of step;
        stops the trace."""
        if self.profile_dir:
            self.trace = self.llm.stop_profile()
        spent, self._measuring = self._spent, False
        self.measured_efficiency = self._counted
        if spent is None:
            return []
        return [b for b in (spent.breakdown("decode"), spent.breakdown("prefill")) if b]

    def _note_speculation(self) -> None:
        """Acceptance so far (warm-up runs included) into `info`, which the report prints."""
        speculation = self.llm.engine.speculation
        if speculation is None:
            return
        m = speculation.metrics
        if m.num_drafts == 0:
            self.info["acceptance rate"] = "no draft verified (none would pay)"
            return
        self.info["acceptance rate"] = f"{m.acceptance_rate:.3f} of {m.num_draft_tokens} drafts"
        self.info["mean acceptance length"] = (
            f"{m.mean_acceptance_length:.2f} over {m.num_drafts} verifications (warm-up included)"
        )

    def close(self) -> None:
        self.llm = None

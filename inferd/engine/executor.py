"""The device side of a step: run what the scheduler decided and sample, changing no request.

    SchedulerOutput → zero first-use blocks, copy forked blocks → the model → the sampler
                    → ModelRunnerOutput (token ids, logprobs)

The runner (`runner.py`, or its tensor-parallel proxy `tp_runner.py`) owns the KV cache tensors
and the model; the sampler draws every row of the step in one batch, so a request's seed gives
the same tokens whatever else is in the batch. A sequence verifying drafts (speculative.py) has
a row for its last token and for each draft; its tokens are those `sample_drafted` keeps.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial

import torch

from inferd.engine.runner import SequenceStep
from inferd.engine.sampler import Sampler, SampleResult, SamplingRow, prompt_logprobs
from inferd.engine.speculative import DraftedSample, sample_drafted
from inferd.engine.step import ModelRunnerOutput, ScheduledSequence, SchedulerOutput
from inferd.outputs import PositionLogprobs
from inferd.profiling.step_timer import StepTimer


class Executor:
    def __init__(self, runner, sampler: Sampler, eos_token_ids: tuple[int, ...] = (),
                 grammars=None, timer: StepTimer | None = None):  # fmt: skip
        """`grammars`: the engine's StructuredOutputs, which constrains the rows of sequences
        under a grammar; `timer`: the engine's step timer; the executor marks where "prepare"
        and "sample" begin, the runner where "forward" does."""
        self.runner, self.sampler, self.eos_token_ids = runner, sampler, eos_token_ids
        self.grammars = grammars
        self.timer = timer or StepTimer()  # a private one records nothing: no step is started

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        self.timer.begin("prepare")
        self.runner.clear_blocks(out.blocks_to_clear)  # before the copies: they may land there
        self.runner.copy_blocks(out.block_copies)
        steps = [
            SequenceStep(s.token_ids, s.num_computed, s.block_tables, s.needs_logits,
                         all_logits=s.prompt_logprobs, verify=bool(s.draft_token_ids))
            for s in out.scheduled
        ]  # fmt: skip
        start = time.perf_counter()
        logits, every = self.runner.execute_with_prompt_logits(steps, self.timer)
        if logits.device.type == "cuda":  # kernels run asynchronously: time them, not the launch
            torch.cuda.synchronize(logits.device)
        forward = time.perf_counter() - start  # the speculation planner's cost model reads it
        self.timer.begin("sample")
        prompt = {
            out.scheduled[i].seq.seq_id: _prompt_logprobs(out.scheduled[i], rows)
            for i, rows in every.items()
        }
        # One sampling row per sample: an n > 1 request whose prompt just finished reads its
        # logits row n times, once for each sample. A sequence with k drafts has k + 1 rows.
        samples, first = [], 0
        for s in out.scheduled:
            if not s.needs_logits:
                continue
            drafts = s.draft_token_ids
            if drafts and s.seq.matcher is not None:  # see _sample: its mask needs one row
                raise RuntimeError(f"sequence {s.seq.seq_id} is under a grammar but has drafts")
            for seq in s.samples:
                samples.append(
                    DraftedSample(first, drafts, partial(self._sampling_row, seq, drafts))
                )
            first += len(drafts) + 1
        if not samples:
            return ModelRunnerOutput([], [], prompt, forward)
        start = time.perf_counter()
        tokens, logprobs = sample_drafted(self._sample, logits, samples)
        return ModelRunnerOutput(tokens, logprobs, prompt, forward, time.perf_counter() - start)

    def _sample(self, logits: torch.Tensor, rows: list[SamplingRow]) -> SampleResult:
        """One sampler call of `sample_drafted`'s rounds: the grammar's mask (or check-first)
        applies per call, to the rows of sequences under a grammar. NOTE: such sequences get
        no drafts (speculative.py), so each has exactly one row, in the first round; `logits`
        is the round's own copy (index_select), which masking changes in place."""
        if self.grammars is None:
            return self.sampler(logits, rows)
        return self.grammars.sample(self.sampler, logits, rows)

    def _sampling_row(self, seq, drafts: Sequence[int] = (), j: int = 0) -> SamplingRow:
        """Row j of `seq`: drafts[:j] come before it and count as output (penalties,
        min_tokens)."""
        req = seq.request
        output = seq.output_token_ids + list(drafts[:j]) if j else seq.output_token_ids
        return SamplingRow(req.params, req.prompt_token_ids, output, seq.generator,
                           self.eos_token_ids, seq.matcher)  # fmt: skip

    def shutdown(self) -> None:
        """Release what outlives the object: tensor-parallel worker processes."""
        stop = getattr(self.runner, "shutdown", None)
        if stop is not None:
            stop()


def _prompt_logprobs(s: ScheduledSequence, logits: torch.Tensor) -> list[PositionLogprobs]:
    """Logprobs of the prompt tokens this step's positions predict: position p's logits give
    the logprob of prompt token p + 1."""
    seq = s.seq
    start = s.num_computed
    last = min(start + s.num_new_tokens, seq.num_prompt_tokens - 1)
    if last <= start:
        return []
    targets = seq.token_ids[start + 1 : last + 1]
    return prompt_logprobs(logits[: last - start], targets, seq.request.params.prompt_logprobs)

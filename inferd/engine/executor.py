"""The device side of a step: run what the scheduler decided and sample, changing no request.

    SchedulerOutput → zero first-use blocks, copy forked blocks → the model → the sampler
                    → ModelRunnerOutput (token ids, logprobs)

The runner (`runner.py`, or its tensor-parallel proxy `tp_runner.py`) owns the KV cache tensors
and the model; the sampler draws every row of the step in one batch, so a request's seed gives
the same tokens whatever else is in the batch.
"""

from __future__ import annotations

import torch

from inferd.engine.runner import SequenceStep
from inferd.engine.sampler import Sampler, SamplingRow, prompt_logprobs
from inferd.engine.step import ModelRunnerOutput, ScheduledSequence, SchedulerOutput
from inferd.outputs import PositionLogprobs


class Executor:
    def __init__(self, runner, sampler: Sampler, eos_token_ids: tuple[int, ...] = (),
                 grammars=None):  # fmt: skip
        self.runner, self.sampler, self.eos_token_ids = runner, sampler, eos_token_ids
        self.grammars = grammars  # StructuredOutputs: constrains the rows that follow a grammar

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        self.runner.clear_blocks(out.blocks_to_clear)  # before the copies: they may land there
        self.runner.copy_blocks(out.block_copies)
        steps = [
            SequenceStep(s.token_ids, s.num_computed, s.block_tables, s.needs_logits,
                         all_logits=s.prompt_logprobs)
            for s in out.scheduled
        ]  # fmt: skip
        logits, every = self.runner.execute_with_prompt_logits(steps)
        prompt = {
            out.scheduled[i].seq.seq_id: _prompt_logprobs(out.scheduled[i], rows)
            for i, rows in every.items()
        }
        # One sampling row per sample: an n > 1 request whose prompt just finished reads its
        # logits row n times, once for each sample.
        index, rows = [], []
        for row, s in enumerate(s for s in out.scheduled if s.needs_logits):
            for seq in s.samples:
                index.append(row)
                rows.append(self._sampling_row(seq))
        if not rows:
            return ModelRunnerOutput([], [], prompt)
        picked = logits.index_select(0, torch.tensor(index, device=logits.device))
        if self.grammars is not None:
            result = self.grammars.sample(self.sampler, picked, rows)  # masks `picked` in place
        else:
            result = self.sampler(picked, rows)
        logprobs = [None if lp is None else [lp] for lp in result.logprobs]
        return ModelRunnerOutput([[t] for t in result.token_ids], logprobs, prompt)

    def _sampling_row(self, seq) -> SamplingRow:
        req = seq.request
        return SamplingRow(req.params, req.prompt_token_ids, seq.output_token_ids, seq.generator,
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

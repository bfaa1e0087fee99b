"""The device side of a step: run a step record and sample, changing no request.

    StepRecord → runner.execute_step (block clears and copies, the record's deltas, the model)
               → the sampler, one pass over every row → the rejection pass of drafted rows
               → ModelRunnerOutput (token ids, logprobs; the embeddings of pooling rows whose
                 prompt the step finished: engine/execution/pooler.py)

The runner (`runner.py`, or its tensor-parallel proxy `tp_runner.py`) owns the KV cache tensors,
the model and the device side's copy of the sequences (device_state.py), which is where a row's
sampling state comes from: its params, prompt and output tokens, its generator. The sampler draws
every row of the step in one batch, so a request's seed gives the same tokens whatever else is in
the batch. A sequence verifying drafts (speculative.py) has a row for its last token and for each
draft; its tokens are those `accept_drafts` keeps.
"""

from __future__ import annotations

import time

import torch

from inferd.engine.execution.device_state import DeviceSequences, SequenceStep
from inferd.engine.sampling.sampler import Sampler, SamplingRow, prompt_logprobs
from inferd.engine.scheduling.speculative import DraftedSample, accept_drafts
from inferd.engine.scheduling.step import ModelRunnerOutput, ScheduledRow, StepRecord
from inferd.outputs import PositionLogprobs
from inferd.profiling.step_timer import StepTimer


class Executor:
    def __init__(self, runner, sampler: Sampler, eos_token_ids: tuple[int, ...] = (),
                 timer: StepTimer | None = None):  # fmt: skip
        """`timer`: the engine's step timer; the executor marks where "prepare" and "sample"
        begin, the runner where "forward" does."""
        self.runner, self.sampler, self.eos_token_ids = runner, sampler, eos_token_ids
        self.timer = timer or StepTimer()  # a private one records nothing: no step is started

    def execute(self, record: StepRecord) -> ModelRunnerOutput:
        self.timer.begin("prepare")
        start = time.perf_counter()
        logits, every, steps, pooled = self.runner.execute_step(record, self.timer)
        if logits.device.type == "cuda":  # kernels run asynchronously: time them, not the launch
            torch.cuda.synchronize(logits.device)
        forward = time.perf_counter() - start  # the speculation planner's cost model reads it
        self.timer.begin("sample")
        sequences: DeviceSequences = self.runner.sequences
        prompt = {
            record.rows[i].seq_id: _prompt_logprobs(record.rows[i], steps[i], rows, sequences)
            for i, rows in every.items()
        }
        embeddings = _embeddings(record, pooled, sequences)
        rows, index, samples = self._sampling_rows(record, sequences, logits.device)
        if not rows:
            return ModelRunnerOutput([], [], prompt, forward, embeddings=embeddings)
        start = time.perf_counter()
        if index != list(range(logits.shape[0])):  # n > 1: a fork reads its parent's row
            logits = logits.index_select(0, torch.tensor(index, device=logits.device))
        tokens, logprobs = accept_drafts(self.sampler(logits, rows), samples)
        return ModelRunnerOutput(tokens, logprobs, prompt, forward, time.perf_counter() - start,
                                 embeddings)  # fmt: skip

    def _sampling_rows(self, record: StepRecord, sequences: DeviceSequences,
                       device: torch.device):  # fmt: skip
        """(sampling rows, the logits row each reads, the samples they make up). One row per
        sample: an n > 1 request whose prompt just finished reads its logits row n times; a
        sequence with k drafts has k + 1 rows, row j as if drafts[:j] were output already."""
        rows: list[SamplingRow] = []
        index: list[int] = []
        samples: list[DraftedSample] = []
        first = 0
        for row in record.rows:
            if not row.needs_logits:
                continue
            drafts = row.draft_token_ids
            for seq_id in row.sample_ids:
                seq = sequences[seq_id]
                mask = record.grammar_bitmasks.get(seq_id)
                if drafts and mask is not None:  # one mask: for the row after the last token
                    raise RuntimeError(f"sequence {seq_id} is under a grammar but has drafts")
                generator = sequences.generator_of(seq_id, device)
                samples.append(DraftedSample(len(rows), drafts, generator))
                output = seq.output_token_ids
                for j in range(len(drafts) + 1):
                    rows.append(
                        SamplingRow(seq.params, seq.prompt_token_ids,
                                    output + drafts[:j] if j else output, generator,
                                    self.eos_token_ids, mask,
                                    keep_generator_state=bool(drafts) and generator is not None)
                    )  # fmt: skip
                    index.append(first + j)
            first += len(drafts) + 1
        return rows, index, samples

    def shutdown(self) -> None:
        """Release what outlives the object: tensor-parallel worker processes."""
        stop = getattr(self.runner, "shutdown", None)
        if stop is not None:
            stop()


def _embeddings(record: StepRecord, pooled: dict[int, torch.Tensor],
                sequences: DeviceSequences) -> dict[int, list[float]]:  # fmt: skip
    """Fold each pooling row's part into its sequence's pooling; seq_id → the embedding of
    each whose prompt this step finished."""
    out = {}
    for i, row in enumerate(record.rows):
        seq = sequences[row.seq_id]
        if seq.pooling is None:
            continue
        seq.pooling.add(pooled.get(i), row.num_computed)
        if row.num_computed + row.num_new_tokens == seq.num_prompt_tokens:
            out[row.seq_id] = seq.pooling.finish(seq.num_prompt_tokens)
    return out


def _prompt_logprobs(row: ScheduledRow, step: SequenceStep, logits: torch.Tensor,
                     sequences: DeviceSequences) -> list[PositionLogprobs]:  # fmt: skip
    """Logprobs of the prompt tokens this step's positions predict: position p's logits give
    the logprob of prompt token p + 1."""
    seq = sequences[row.seq_id]
    start = row.num_computed
    last = min(start + row.num_new_tokens, seq.num_prompt_tokens - 1)
    if last <= start:
        return []
    targets = seq.prompt_token_ids[start + 1 : last + 1]
    return prompt_logprobs(logits[: last - start], targets, seq.params.prompt_logprobs)

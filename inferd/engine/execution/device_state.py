"""The device side's copy of each running sequence, kept up to date by the step records.

    StepRecord ──apply()──▶ DeviceSequences: tokens, block tables, sampling state per seq_id
                            └─ forward_rows(): the step's rows as the runner computes them

The scheduler sends a sequence's prompt once and then only deltas (engine/scheduling/step.py); this
is where the deltas land. Every runner keeps one (rank 0 and each tensor-parallel worker, which
therefore receive the same small record every step rather than whole block tables). Only rank 0
samples, so only there does a seeded sequence get its generator (on first use, `generator_of`), and
only there are its sampling params read.

NOTE: a preempted sequence is not forgotten: its generator must go on from where it was so that
a seeded request draws the same tokens after recomputing; its next row brings new block tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from inferd.engine.execution.pooler import PoolingState
from inferd.engine.sampling.sampler import make_generator
from inferd.engine.scheduling.step import BASE_MODEL, StepRecord
from inferd.multimodal.image_input import ImageInput
from inferd.sampling_params import SamplingParams


@dataclass
class SequenceStep:
    """One sequence's share of a forward pass, as the runner computes it (built from a record's
    row by `DeviceSequences.forward_rows`; tests drive the runner with it directly)."""

    token_ids: list[int]  # the tokens to compute now (a verification row: last token + drafts)
    num_computed: int  # tokens of this sequence already in the KV cache
    block_tables: list[list[int]]  # one block table per KV group
    needs_logits: bool = (
        True  # the step reaches the last known token (see engine/scheduling/step.py)
    )
    all_logits: bool = False  # also return logits of every new token (prompt logprobs)
    # Speculative verification: the last token and its drafts. Every token gets a logits row
    # (in `execute`'s result, in order), and each is computed as a decode row of its own.
    verify: bool = False
    # An embedding request's pooling type ("last", "mean", "cls"): the runner returns the part
    # of this row's hidden states it needs (engine/execution/pooler.py); None: a generating row.
    pooling: str | None = None
    adapter_slot: int = BASE_MODEL  # the LoRA slot its tokens run under (engine/scheduling/step.py)
    # Input embeddings in place of some tokens' own (image features at their placeholders):
    # (index among `token_ids` of the first, rows [n, hidden]) per run of such tokens.
    embeds: tuple[tuple[int, torch.Tensor], ...] = ()

    @property
    def num_logits(self) -> int:
        """Rows this step contributes to the logits `execute` returns."""
        if not self.needs_logits:
            return 0
        return len(self.token_ids) if self.verify else 1


@dataclass
class DeviceSequence:
    # NOTE: prompt and output apart: the sampler reads both every step (penalties), without a
    # copy of either.
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # accepted output tokens, as the scheduler sent them
    block_tables: list[list[int]]
    params: SamplingParams
    seed: int | None
    generator: torch.Generator | None = None  # made on first use, from `seed`
    pooling: PoolingState | None = None  # an embedding request's pooling so far
    images: list[ImageInput] = field(default_factory=list)  # its prompt's (NewSequence.images)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def token_ids(self) -> list[int]:
        """Prompt and output (a new list)."""
        return self.prompt_token_ids + self.output_token_ids

    def tokens(self, start: int, n: int) -> list[int]:
        """Tokens start .. start + n - 1 (a decode step's one token without a copy of all)."""
        p = len(self.prompt_token_ids)
        if start >= p:
            return self.output_token_ids[start - p : start - p + n]
        if start + n <= p:
            return self.prompt_token_ids[start : start + n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: start + n - p]


class DeviceSequences:
    def __init__(self, num_groups: int):
        self.num_groups = num_groups
        self.sequences: dict[int, DeviceSequence] = {}

    def __getitem__(self, seq_id: int) -> DeviceSequence:
        return self.sequences[seq_id]

    def __len__(self) -> int:
        return len(self.sequences)

    def apply(self, record: StepRecord) -> None:
        """Take in the record's deltas (before the step runs)."""
        for seq_id in record.finished_seq_ids:
            self.sequences.pop(seq_id, None)
        for new in record.new_sequences:
            prompt, images = new.prompt_token_ids, new.images
            if new.fork_of is not None:  # NOTE: shared, never written: prompts do not change
                prompt = self.sequences[new.fork_of].prompt_token_ids
                images = self.sequences[new.fork_of].images
            pooling = None if new.pooling is None else PoolingState(new.pooling)
            tables = [[] for _ in range(self.num_groups)]
            self.sequences[new.seq_id] = DeviceSequence(
                prompt, [], tables, new.params, new.seed, pooling=pooling, images=images
            )
        for row in record.rows:
            seq = self.sequences[row.seq_id]
            if row.new_token_ids:
                seq.output_token_ids += row.new_token_ids
            if row.block_updates is not None:
                seq.block_tables = [
                    table if update is None else update.apply(table)
                    for table, update in zip(seq.block_tables, row.block_updates, strict=True)
                ]

    def forward_rows(self, record: StepRecord) -> list[SequenceStep]:
        """The record's rows with their tokens and tables (after `apply`)."""
        steps = []
        for row in record.rows:
            seq = self.sequences[row.seq_id]
            start = row.num_computed
            tokens = seq.tokens(start, row.num_new_tokens)
            if row.draft_token_ids:
                tokens = tokens + row.draft_token_ids
            steps.append(
                SequenceStep(
                    tokens,
                    start,
                    seq.block_tables,
                    row.needs_logits,
                    all_logits=row.prompt_logprobs,
                    verify=bool(row.draft_token_ids),
                    pooling=None if seq.pooling is None else seq.pooling.params.pooling_type,
                    adapter_slot=row.adapter_slot,
                )  # fmt: skip
            )
        return steps

    def generator_of(self, seq_id: int, device: torch.device) -> torch.Generator | None:
        """The sequence's own generator when it is seeded (made now on first use)."""
        seq = self.sequences[seq_id]
        if seq.seed is not None and seq.generator is None:
            seq.generator = make_generator(seq.seed, device)
        return seq.generator

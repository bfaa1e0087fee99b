"""What one engine step is made of, as plain data passed between its three stages:

    Scheduler.schedule() ──SchedulerOutput──▶ Executor.execute() ──ModelRunnerOutput──▶
    Scheduler.update_from_output() ──▶ the requests to report

`SchedulerOutput` is everything the device side needs for the step (which tokens of which
sequences to compute, over which KV blocks, which blocks to zero or copy first, which sequences
draw a token from which logits row); `ModelRunnerOutput` is what came back (sampled token ids,
logprobs). Neither side reaches into the other: the scheduler never sees a tensor, the executor
never changes a request.

A step that verifies draft tokens (speculative decoding, engine/speculative.py) computes the
sequence's last token followed by its drafts and returns several tokens for it in
`sampled_token_ids`. Per-row extras (a grammar's token bitmask, step timings) become fields here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferd.engine.request import Sequence
    from inferd.outputs import PositionLogprobs


@dataclass
class ScheduledSequence:
    """One sequence's share of a step, fixed when it was scheduled. The block tables are the
    sequence's own lists: valid until the next `schedule()`."""

    seq: Sequence
    num_computed: int  # tokens already in the KV cache: the step's first position
    token_ids: list[int]  # the tokens computed in this step
    block_tables: list[list[int]]  # one per KV group, covering every token computed now
    # The step reaches the last known token: a token is sampled from its logits.
    needs_logits: bool = False
    # Logits of every new token are needed too (prompt logprobs of a prompt chunk).
    prompt_logprobs: bool = False
    # Samples 1..n-1 of the request: the step completes the prompt, so they start now, each
    # drawing its first token from this sequence's logits row.
    forks: list[Sequence] = field(default_factory=list)
    # Speculative decoding: drafts to verify, the tail of `token_ids` (after the sequence's last
    # token). The step needs a logits row for the last token and for each draft.
    draft_token_ids: list[int] = field(default_factory=list)

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def samples(self) -> list[Sequence]:
        """The sequences that draw a token from this sequence's logits row."""
        return [self.seq, *self.forks] if self.needs_logits else []


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSequence]
    preempted: list[Sequence]
    # Per KV group: blocks handed out for the first time, to zero before the step runs.
    blocks_to_clear: list[list[int]] = field(default_factory=list)
    # (group, source, destination) KV blocks to copy, after clearing and before the step runs:
    # the partly filled last block of a parent for each fork started by the previous step.
    block_copies: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def sampled(self) -> list[Sequence]:
        """Who gets tokens this step, in the order of `ModelRunnerOutput.sampled_token_ids`."""
        return [seq for s in self.scheduled for seq in s.samples]


@dataclass
class ModelRunnerOutput:
    # One list per entry of `SchedulerOutput.sampled`: the tokens drawn for that sequence (one,
    # or after verifying drafts: the accepted drafts and the token that follows them).
    sampled_token_ids: list[list[int]]
    # Same order, one entry per sampled token; None where the request asked for no logprobs.
    # May be left empty when no request asked.
    logprobs: list[list[PositionLogprobs] | None] = field(default_factory=list)
    # seq_id → logprobs of the prompt tokens this step's positions predict (prompt_logprobs).
    prompt_logprobs: dict[int, list[PositionLogprobs]] = field(default_factory=dict)
    # What the step took (wall seconds): the model, the sampler. Speculative decoding plans
    # how many drafts are worth a row from these (spec_decode/planner.py).
    forward_seconds: float = 0.0
    sampling_seconds: float = 0.0

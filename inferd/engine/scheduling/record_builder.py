"""Turning the scheduler's choice for a step into its `StepRecord` (engine/scheduling/step.py): the
rows, each sequence's prompt the first time it runs, the tokens and block-table changes since the
device side last saw it, and the per-row features read off the request's state (drafts, grammar
bitmasks). The scheduler decides; this writes it down and remembers what was sent."""

from __future__ import annotations

from inferd.engine.scheduling.request import Sequence
from inferd.engine.scheduling.step import NewSequence, ScheduledRow, StepRecord, diff_table


def _sent_news(seq: Sequence, num_groups: int) -> tuple[list[int], list | None]:
    """(tokens gained, per-group block updates or None) since the device side last saw `seq`,
    and remember what it knows now."""
    new_tokens = seq.token_ids[seq.num_sent_tokens :]
    seq.num_sent_tokens = seq.num_tokens
    tables = seq.block_tables or [[] for _ in range(num_groups)]
    updates = [diff_table(old, new) for old, new in zip(seq.sent_tables, tables, strict=True)]
    if all(u is None for u in updates):  # most steps: no table changed
        return new_tokens, None
    seq.sent_tables = [list(t) for t in tables]
    return new_tokens, updates


def _introduce(seq: Sequence, num_groups: int, fork_of: int | None = None) -> NewSequence:
    """The sequence's first record entry; its prompt is sent once (a fork's: not at all)."""
    req = seq.request
    seq.sent, seq.num_sent_tokens = True, seq.num_prompt_tokens
    seq.sent_tables = [[] for _ in range(num_groups)]
    prompt = [] if fork_of is not None else list(seq.token_ids[: seq.num_prompt_tokens])
    images = [] if fork_of is not None else req.images
    return NewSequence(seq.seq_id, prompt, req.params, req.seed_of(seq), fork_of, req.pooling,
                       images)  # fmt: skip


def build_record(
    chosen: list[tuple[Sequence, int, list[int]]],
    num_groups: int,
    now: float,
) -> StepRecord:
    """The record of a step that computes `n` tokens of each chosen sequence (its drafts
    included, which come last), scheduled at `now` (the requests' timelines)."""
    record = StepRecord()
    for seq, n, drafts in chosen:
        req, start = seq.request, seq.num_computed
        req.metrics.first_scheduled_time = req.metrics.first_scheduled_time or now
        if not seq.sent:
            record.new_sequences.append(_introduce(seq, num_groups))
        n -= len(drafts)
        # NOTE: an embedding request samples nothing: its last chunk returns its embedding.
        needs_logits = start + n == seq.num_tokens and req.pooling is None
        forks = list(req.forks) if needs_logits and not req.forked else []
        for child in forks:
            record.new_sequences.append(_introduce(child, num_groups, fork_of=seq.seq_id))
        new_tokens, updates = _sent_news(seq, num_groups)
        record.rows.append(
            ScheduledRow(
                seq.seq_id,
                start,
                n,
                new_tokens,
                updates,
                needs_logits,
                prompt_logprobs=req.wants_prompt_logprobs and start < seq.num_prompt_tokens,
                draft_token_ids=drafts,
                fork_seq_ids=[c.seq_id for c in forks],
                adapter_slot=req.adapter_slot,
            )
        )
        if needs_logits and req.grammar is not None:
            for sample in (seq, *forks):
                record.grammar_bitmasks[sample.seq_id] = req.grammar.bitmask(sample.matcher)
    return record

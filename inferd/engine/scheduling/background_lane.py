"""The background lane: requests (a batch's lines, server/batches/) whose prompts are computed
only in the room that interactive requests leave, so that an interactive client's time to first
token (TTFT) barely changes while a batch runs.

On a CPU a step's time grows with its prompt tokens, and a request that arrives while a step
runs waits for that step to end. A batch line's whole prompt in one step made such a step as long
as the interactive request's own prefill, and an unlucky arrival waited for both (TTFT p99 2x).
So the scheduler (scheduler.py) applies three rules, all about prompt tokens:

1. a step computes at most BACKGROUND_PREFILL_TOKENS tokens of background prompts, over all
   background requests (a recompute after preemption is a prompt too): any step an interactive
   request may have to wait for is about as short as a decode step;
2. a step that computes an interactive prompt computes no background prompt: the running
   background prefills are scheduled after the waiting queue (`schedule_after_waiting`), only
   when no interactive prompt took the step;
3. a waiting background request is admitted only when no interactive request waits, no
   interactive prompt is in the step, and no other background prompt is being computed (one at
   a time, so rule 1's budget goes to the oldest).

A background request's decodes (one token each) run in every step like anyone's: they cost the
step little, and pausing them would only lengthen the batch. Nothing here can starve the queue:
rule 2 pauses background prompts only in steps where an interactive prompt progresses, and rule 3
only keeps a background request waiting, holding nothing. The tokens are unchanged: a prompt's
chunking never changes what a request computes (docs/engine.md).

The lane is orthogonal to the scheduling policy: under `priority` a batch's lines also have the
lowest priority (a waiting interactive request may preempt one), under `fcfs` they keep their
place in the queue but are passed over while an interactive request waits behind them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from inferd.engine.scheduling.request import Sequence

# Chosen, not tuned: a fifth of a typical 40-token interactive prompt, so that the step such a
# request may wait for adds a fraction of its own prefill, while a batch line's prompt still
# takes only a few steps. docs/server.md "Batches" has the TTFT figures it gives.
BACKGROUND_PREFILL_TOKENS = 8


def is_prefill(seq: Sequence) -> bool:
    """Whether the sequence has prompt tokens (or recomputed ones) left beyond its last."""
    return seq.num_tokens - seq.num_computed > 1


def split_prefills(prefills: list[Sequence]) -> tuple[list[Sequence], list[Sequence]]:
    """(interactive prefills, background prefills): the latter wait for rule 2."""
    return ([s for s in prefills if not s.request.background],
            [s for s in prefills if s.request.background])  # fmt: skip


def interactive_prefill_in(chosen: Iterable[tuple[Sequence, int, list[int]]]) -> bool:
    """Whether the step computes an interactive prompt (rule 2)."""
    # NOTE: `is_prefill` and not the row's size: a decode with speculative drafts takes more
    # than one token, and must not pause the lane.
    return any(not s.request.background and is_prefill(s) for s, _, _ in chosen)


def background_prefill_budget(chosen: Iterable[tuple[Sequence, int, list[int]]],
                              budget: int) -> int:  # fmt: skip
    """The background prompt tokens this step may still take (rules 1 and 2), within `budget`,
    the step's tokens left."""
    chosen = list(chosen)
    if interactive_prefill_in(chosen):
        return 0
    taken = sum(n for s, n, _ in chosen if s.request.background and is_prefill(s))
    return max(0, min(budget, BACKGROUND_PREFILL_TOKENS - taken))


def may_admit_background(waiting: Iterable[Sequence], running: Iterable[Sequence],
                         chosen: list[tuple[Sequence, int, list[int]]]) -> bool:  # fmt: skip
    """Rule 3: whether a waiting background sequence may be admitted in this step. Once false
    it stays so for the rest of the step (the scheduler asks no more)."""
    if any(not s.request.background for s in waiting):
        return False
    if any(s.request.background and is_prefill(s) for s in running):
        return False
    return background_prefill_budget(chosen, BACKGROUND_PREFILL_TOKENS) > 0

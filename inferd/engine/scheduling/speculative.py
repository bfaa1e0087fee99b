"""Speculative decoding in the engine step: n-gram prompt lookup (inferd/spec_decode/).

One step of a sequence with drafts d_0..d_{k-1}:

    schedule()            the proposer looks drafts up in the sequence's own tokens and the
                          planner (spec_decode/planner.py) picks how many of them are worth
                          verifying; the step computes the last token and those k drafts
                          (1 + k tokens of the budget, KV slots for all of them) and returns
                          k + 1 logits rows (runner.py: `verify`)
    execute()             the sampler draws every row of the step in one pass, row j as if
                          d_0..d_{j-1} were output already (penalties, min_tokens); then the
                          rejection pass (`accept_drafts`) keeps the drafts while each equals
                          its row's token, then adds the token of the first row that disagrees
                          (or of row k): 1 .. k + 1 tokens
    update_from_output()  the kept tokens are appended one by one (stop strings, max_tokens: the
                          first finish drops the rest); the KV of the last token and of the
                          accepted drafts stays (num_computed moves past them), the slots of
                          rejected drafts are overwritten later, and blocks that hold nothing but
                          rejected drafts go back to the pool (`KVCacheManager.release_tail`)

Drafts never enter `Sequence.token_ids`, so everything that reads the tokens (prefix-cache hashes,
detokenizer, recompute after preemption) only ever sees accepted tokens.

Exactness: row j's token is what plain decoding would pick after the same tokens, so keeping
drafts while they agree gives the tokens of plain decoding. Greedy rows are the argmax of each
row. A sampled row j is one draw from the distribution plain decoding would have after d_0..d_{j-1};
its noise does not depend on whether earlier rows agreed, so each emitted token is distributed as
in plain decoding. A seeded sequence's rows draw from its generator in row order, exactly the
draws plain decoding would make for those positions; the rows after the first disagreement drew
too, so the rejection pass sets the generator back to its state after the last emitted row's draw
(the sampler recorded it), and the next step draws what plain decoding would: a seeded request
gets the tokens it gets without speculation. For drafts of probability 1 this is the rejection
rule of spec_decode/rejection.py: d_j is kept with probability p_j(d_j), and on a rejection the
token drawn is distributed as p_j without d_j. The cost: every row of a sampled sequence draws,
rejected ones too (a full-vocabulary draw costs about as much as a model row on a CPU), which the
planner's sampling seconds per token count.

One more condition for the same tokens: the same numbers. Verification rows must get the bits
plain decode rows get, which holds where a row's result does not depend on the rest of its step:
the default mode on GGUF blocks (CPU) and `--deterministic` (docs/performance.md). Dense modes
without it only round the same arithmetic in another order, so near-ties can flip there.

Sequences under a grammar (structured outputs) get no drafts: their rows would each need the
grammar's mask after the drafts before them. Simplest correct rule; drafts there rarely pay.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inferd.engine.sampling.sampler import SampleResult
from inferd.engine.scheduling.request import Sequence
from inferd.engine.scheduling.step import ModelRunnerOutput, StepRecord
from inferd.outputs import PositionLogprobs
from inferd.spec_decode import (
    AcceptanceEstimate,
    NgramProposer,
    SpecDecodeMetrics,
    SpeculativeConfig,
    StepCosts,
    draft_room,
    plan_drafts,
)

SAMPLING_EMA = 0.1  # weight of the latest step in the sampling seconds per token


class Speculation:
    """The engine's proposer, planner state and counters: one per engine, driven by the
    scheduler. `adaptive` False verifies every draft looked up (tests, experiments)."""

    def __init__(self, config: SpeculativeConfig, max_model_len: int, adaptive: bool = True):
        self.config = config
        self.max_model_len = max_model_len
        self.adaptive = adaptive
        self.proposer = NgramProposer(config)
        self.metrics = SpecDecodeMetrics(config.num_speculative_tokens)
        self.costs = StepCosts()
        self.sampling_seconds_per_token = 0.0
        self._estimates: dict[int, AcceptanceEstimate] = {}

    def plan(self, decodes: list[Sequence], base_rows: int, max_rows: int) -> dict[int, list[int]]:
        """seq_id → the drafts to verify this step, for the decoding sequences of a step that
        has `base_rows` tokens without drafts and may have `max_rows`. Safe to call again for a
        step that did not run: the lookups are idempotent."""
        lookups, estimates = [], []
        for seq in decodes:
            estimate = self._estimates.setdefault(seq.seq_id, AcceptanceEstimate())
            estimate.score_shadow(seq.token_ids)
            lookups.append(self._lookup(seq))
            estimates.append(estimate)
        if self.adaptive:
            counts = plan_drafts(lookups, [e.p for e in estimates], base_rows, max_rows,
                                 self.costs, self.sampling_seconds_per_token)  # fmt: skip
        else:  # every draft, as many as the step holds, one per sequence in turn
            room, counts = max_rows - base_rows, [0] * len(lookups)
            while room > 0 and any(c < len(d) for c, d in zip(counts, lookups, strict=True)):
                for i, lookup in enumerate(lookups):
                    if room > 0 and counts[i] < len(lookup):
                        counts[i] += 1
                        room -= 1
        plan = {}
        for seq, lookup, estimate, k in zip(decodes, lookups, estimates, counts, strict=True):
            if k:
                plan[seq.seq_id] = lookup[:k]
                estimate.shadow = []  # a verification tells more than the pending shadow
            elif lookup:
                estimate.set_shadow(lookup, seq.num_tokens)
        return plan

    def _lookup(self, seq: Sequence) -> list[int]:
        req = seq.request
        if seq.matcher is not None or req.params.structured_outputs is not None:
            return []  # under a grammar: no drafts (the module docstring)
        room = draft_room(seq.num_tokens, seq.num_output_tokens, req.max_tokens,
                          self.max_model_len)  # fmt: skip
        return self.proposer.propose(seq.seq_id, seq.token_ids, room)

    def verified(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        self._estimates[seq.seq_id].observe(num_drafted, num_accepted)
        self.metrics.observe(num_drafted, num_accepted)

    def observe_step(self, record: StepRecord, result: ModelRunnerOutput) -> None:
        """Learn what the step cost: the model's seconds by rows for decode steps (every
        sequence's last token plus its drafts), the sampler's seconds per emitted token."""
        decode = all(r.needs_logits and r.num_new_tokens == 1 for r in record.rows)
        if decode and result.forward_seconds > 0:
            self.costs.record(record.num_tokens, result.forward_seconds)
        emitted = sum(len(t) for t in result.sampled_token_ids)
        if emitted and result.sampling_seconds > 0:
            latest = result.sampling_seconds / emitted
            ema = self.sampling_seconds_per_token
            self.sampling_seconds_per_token = latest if ema == 0 else (
                ema + SAMPLING_EMA * (latest - ema))  # fmt: skip

    def forget(self, seq: Sequence) -> None:
        """`seq` finished or was aborted: drop its lookup index and estimate."""
        self.proposer.forget(seq.seq_id)
        self._estimates.pop(seq.seq_id, None)


@dataclass
class DraftedSample:
    """One sample of a step: its sampling rows start at `first`, one per draft plus one;
    `generator` is its own when seeded."""

    first: int
    drafts: list[int]
    generator: torch.Generator | None = None


def accept_drafts(
    result: SampleResult, samples: list[DraftedSample]
) -> tuple[list[list[int]], list[list[PositionLogprobs] | None]]:
    """The rejection pass after the sampler's: each sample's tokens (the drafts kept while each
    equals its row's token, then the token of the first row that disagrees, or of the last row)
    and their logprobs (None where the request asked for none); a seeded sample's generator is
    put back to its state after the last emitted row's draw."""
    tokens: list[list[int]] = []
    logprobs: list[list[PositionLogprobs] | None] = []
    for s in samples:
        kept = 0
        while kept < len(s.drafts) and result.token_ids[s.first + kept] == s.drafts[kept]:
            kept += 1
        last = s.first + kept  # the row whose token follows the kept drafts
        tokens.append(result.token_ids[s.first : last + 1])
        lps = result.logprobs[s.first : last + 1]
        logprobs.append(None if lps[0] is None else lps)
        states = result.generator_states
        state = states[last] if states and kept < len(s.drafts) else None
        if state is not None:  # a sampled seeded row drew after it: undo those draws
            s.generator.set_state(state)
    return tokens, logprobs

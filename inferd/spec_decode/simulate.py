"""Replaying greedy decoding with n-gram speculation, without a model.

Under greedy decoding speculation changes which steps produce which tokens, never the tokens:
a draft is accepted exactly as far as it agrees with the output decoded without speculation.
So given a prompt and its greedy output, the steps, drafts and acceptance that speculation would
have had follow from the proposer alone. This measures how much lookup a workload offers (and
tests the proposer) in microseconds instead of model steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferd.spec_decode.metrics import SpecDecodeMetrics
from inferd.spec_decode.ngram import NgramProposer, draft_room


@dataclass
class Replay:
    metrics: SpecDecodeMetrics
    decode_steps: int  # model steps after the prefill, with speculation
    output_tokens: int  # = the steps plain decoding needs after the prefill, plus one

    @property
    def tokens_per_step(self) -> float:
        """Output tokens per decode step (plain decoding: 1)."""
        return (self.output_tokens - 1) / self.decode_steps if self.decode_steps else 1.0


def replay_greedy(
    proposer: NgramProposer, prompt_ids: list[int], output_ids: list[int], seq_id: object = 0
) -> Replay:
    """Decode `output_ids` again (the prefill gave the first token), each step verifying the
    proposer's whole draft against the output (no planner: what lookup offers, not what a
    machine's costs make worth verifying). `max_tokens` is the output's length."""
    metrics = SpecDecodeMetrics(proposer.config.num_speculative_tokens)
    if not output_ids:
        return Replay(metrics, 0, 0)
    seq = list(prompt_ids) + [output_ids[0]]
    produced, steps, max_tokens = 1, 0, len(output_ids)
    while produced < max_tokens:
        room = draft_room(len(seq), produced, max_tokens, max_model_len=len(seq) + max_tokens)
        draft = proposer.propose(seq_id, seq, room)
        accepted = 0
        while accepted < len(draft) and draft[accepted] == output_ids[produced + accepted]:
            accepted += 1
        if draft:
            metrics.observe(len(draft), accepted)
        seq += output_ids[produced : produced + accepted + 1]
        produced += accepted + 1
        steps += 1
    proposer.forget(seq_id)
    return Replay(metrics, steps, max_tokens)

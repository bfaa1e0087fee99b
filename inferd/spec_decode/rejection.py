"""Verifying n-gram drafts against the target model: which drafts to keep, and the next token.

A sequence with drafts d_0..d_{k-1} is run for k + 1 positions in one step: position j is the
prediction after the sequence plus d_0..d_{j-1}. Its rows of the target's output decide:

- greedy: accept the longest prefix where d_j == argmax_j, then emit the argmax at the first
  mismatch, or at position k when all were accepted (the bonus token). Every emitted token is
  the argmax given the tokens before it, so the output is token for token that of plain decoding.
- sampled (`verify_sampled`): the speculative sampling rule (Leviathan et al. 2023, as vLLM's
  rejection sampler) for a draft of probability 1, which an n-gram draft is: accept d_j with
  probability p_j(d_j); on the first rejection emit a token drawn from p_j with d_j removed
  (renormalised) and stop; when all k are accepted, draw a bonus token from p_k. Each emitted
  token then follows the target distribution given the tokens before it.

The two are one rule seen twice: drawing x_j ~ p_j and accepting while x_j == d_j accepts with
probability p_j(d_j) and, on a mismatch, emits x_j ~ p_j conditioned on x_j != d_j. So
`verify_greedy` is exact also when its "target tokens" were sampled independently per position
(the engine's ordinary sampler run on all k + 1 rows, with per-row penalties and filters); the
explicit rule in `verify_sampled` is cheaper for unfiltered rows (one uniform per draft and one
draw per sequence instead of a full-vocabulary draw per position).

Contract (both functions): sequences come in batch order with `drafts[i]` of length k_i >= 0,
and their target rows are stacked in the same order, k_i + 1 consecutive rows each (row j of a
sequence = position j above). The target rows are what the sampler would act on at that
position, with the sequence's drafts before it counted as output (penalties, min_tokens).
Emitted token j of a sequence comes from its row j (for logprobs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verified:
    """One sequence's step: the accepted drafts followed by one token of the target model."""

    token_ids: list[int]  # 1 .. k + 1 tokens
    num_accepted: int  # drafts accepted, = len(token_ids) - 1


def _offsets(drafts: Sequence[Sequence[int]], num_rows: int) -> list[int]:
    starts, row = [], 0
    for d in drafts:
        starts.append(row)
        row += len(d) + 1
    if row != num_rows:
        raise ValueError(
            f"the target has {num_rows} rows; the drafts need sum(k_i + 1) = {row} "
            f"(k_i + 1 consecutive rows per sequence)"
        )
    return starts


def verify_greedy(
    drafts: Sequence[Sequence[int]], target_token_ids: torch.Tensor | Sequence[int]
) -> list[Verified]:
    """`target_token_ids`: the target's token at every row, [sum(k_i + 1)]: the argmax of the
    processed logits (the sampler's greedy path, same kernel as plain decoding, so ties break
    the same way), or an independent draw per row from the target distribution."""
    targets = (
        target_token_ids.tolist() if isinstance(target_token_ids, torch.Tensor)
        else list(target_token_ids)
    )  # fmt: skip
    starts = _offsets(drafts, len(targets))
    out = []
    for draft, start in zip(drafts, starts, strict=True):
        accepted = 0
        while accepted < len(draft) and draft[accepted] == targets[start + accepted]:
            accepted += 1
        out.append(Verified(list(draft[:accepted]) + [targets[start + accepted]], accepted))
    return out


def verify_sampled(
    drafts: Sequence[Sequence[int]],
    target_probs: torch.Tensor,
    generators: Sequence[torch.Generator | None],
    default_generator: torch.Generator,
) -> list[Verified]:
    """The rejection rule for drafts of probability 1. `target_probs` [sum(k_i + 1), V]: the
    distribution the sampler would draw from at each row (after penalties, temperature, top-k,
    top-p and min-p; zeros for filtered tokens; rows need not be normalised). A sequence with a
    generator (its seed) draws from it alone: k_i uniforms, then one more for the emitted token,
    so its tokens do not depend on the rest of the batch; the others draw from
    `default_generator` in batch order."""
    if target_probs.dim() != 2:
        raise ValueError(f"target_probs must be [rows, vocab], got {tuple(target_probs.shape)}")
    if len(generators) != len(drafts):
        raise ValueError(f"need one generator (or None) per sequence, got {len(generators)}")
    starts = _offsets(drafts, target_probs.shape[0])
    vocab, device = target_probs.shape[1], target_probs.device
    rows = [s + j for s, d in zip(starts, drafts, strict=True) for j in range(len(d))]
    ids = [t for d in drafts for t in d]
    if ids and not 0 <= min(ids) <= max(ids) < vocab:
        raise ValueError(f"draft token ids must be in [0, {vocab})")
    p_draft = target_probs[_long(rows, device), _long(ids, device)].double()
    # In the rows' own dtype: a float64 reduction over [rows, V] costs ~10x more, and a relative
    # error of 1e-6 in an acceptance probability does not matter.
    norm = target_probs.sum(dim=1)[_long(rows, device)].double()
    p_draft = (p_draft / norm).tolist() if rows else []

    draws = _uniforms([len(d) + 1 for d in drafts], generators, default_generator)
    accepted, pos = [], 0
    for d, u in zip(drafts, draws, strict=True):
        a, k = 0, len(d)
        while a < k and u[a] < p_draft[pos + a]:
            a += 1
        accepted.append(a)
        pos += k
    # The last uniform of each sequence picks its emitted token.
    uniforms = [u[-1] for u in draws]

    final_rows = [s + a for s, a in zip(starts, accepted, strict=True)]
    final = target_probs.index_select(0, _long(final_rows, device))  # a copy: free to edit
    rejected = [i for i, (d, a) in enumerate(zip(drafts, accepted, strict=True)) if a < len(d)]
    if rejected:
        removed = [drafts[i][accepted[i]] for i in rejected]
        final[_long(rejected, device), _long(removed, device)] = 0.0
    picks = _inverse_cdf(final, torch.tensor(uniforms, dtype=torch.float64, device=device))
    out = []
    for i, (d, a) in enumerate(zip(drafts, accepted, strict=True)):
        token = picks[i]
        if token < 0:
            # Nothing left once the draft is removed: the target puts all its mass on the draft
            # (it was "rejected" only by rounding of a probability of 1).
            token = d[a]
        out.append(Verified(list(d[:a]) + [token], a))
    return out


def _uniforms(
    counts: list[int],
    generators: Sequence[torch.Generator | None],
    default_generator: torch.Generator,
) -> list[list[float]]:
    """counts[i] uniforms in [0, 1) per sequence: a fixed number per step whatever is accepted,
    from the sequence's own generator, or for all unseeded ones from one call on the default."""
    shared = [c for c, g in zip(counts, generators, strict=True) if g is None]
    pool = _rand(sum(shared), default_generator)
    out, at = [], 0
    for c, g in zip(counts, generators, strict=True):
        if g is None:
            out.append(pool[at : at + c])
            at += c
        else:
            out.append(_rand(c, g))
    return out


def _rand(n: int, generator: torch.Generator) -> list[float]:
    # On the generator's device: a CUDA generator cannot fill a CPU tensor.
    return torch.rand(n, generator=generator, dtype=torch.float64, device=generator.device).tolist()


def _inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> list[int]:
    """One index per row drawn with probability proportional to its weights, by the
    inverse CDF at `uniforms`; -1 for a row of all zeros. NOTE: float64 matters: a float32
    running sum over 262,144 tokens rounds each token's interval by up to ~1e-7, which summed
    over the vocabulary distorts the distribution by up to a percent."""
    cdf = weights.cumsum(dim=1, dtype=torch.float64)
    total = cdf[:, -1]
    x = (uniforms * total).unsqueeze(1)
    # The first index whose cumulative weight exceeds x: zero-weight tokens never qualify.
    picks = torch.searchsorted(cdf, x, right=True).squeeze(1).clamp_(max=weights.shape[1] - 1)
    # x can round up to the total, past the last token with weight: such rows (and empty ones)
    # are fixed one by one; both are rare.
    bad = (weights.gather(1, picks.unsqueeze(1)).squeeze(1) <= 0).tolist()
    out = picks.tolist()
    for i in (i for i, b in enumerate(bad) if b):
        kept = torch.nonzero(weights[i] > 0)
        out[i] = int(kept[-1]) if kept.numel() else -1
    return out


def _long(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)

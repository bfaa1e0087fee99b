"""Draft verification against its definition.

Greedy: exact, checked by running a toy deterministic model with and without speculation.
Sampled: the output must follow the target distribution. With drafts (d0, d1) and target rows
p0, p1, p2, the first emitted token must be distributed as p0, the second (given the first was
d0) as p1, the third (given d0, d1) as p2, and the accepted count as
(1 - p0(d0), p0(d0)(1 - p1(d1)), p0(d0) p1(d1)). Each is a chi-square test over 20,000 sequences
verified in one call with a fixed seed, against the 0.1% critical value of its degrees of freedom
(a correct sampler fails with probability 0.001 per test for a random seed, never for this
seed); a negative control shows the same test catches the classic bug of resampling without
removing the rejected draft.
"""

from __future__ import annotations

import pytest
import torch

from inferd.spec_decode import (
    NgramProposer,
    SpeculativeConfig,
    Verified,
    draft_room,
    verify_greedy,
    verify_sampled,
)

# Upper 0.1% points of the chi-square distribution, by degrees of freedom.
CHI2_CRITICAL_0_001 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515}

P0 = [0.30, 0.25, 0.20, 0.15, 0.10, 0.00]  # token 5 filtered out (top-k / top-p)
P1 = [0.05, 0.10, 0.15, 0.40, 0.20, 0.10]
P2 = [0.10, 0.10, 0.10, 0.10, 0.10, 0.50]
DRAFT = [1, 3]  # p0(1) = 0.25, p1(3) = 0.40
N = 20_000


def chi_square(counts: list[int], probs: list[float]) -> tuple[float, int]:
    """(statistic, degrees of freedom) over the categories of nonzero probability; a count in a
    category of probability zero is an outright failure."""
    total = sum(counts)
    assert all(c == 0 for c, p in zip(counts, probs, strict=True) if p == 0)
    stat = sum(
        (c - total * p) ** 2 / (total * p) for c, p in zip(counts, probs, strict=True) if p > 0
    )
    return stat, sum(p > 0 for p in probs) - 1


def assert_follows(counts: list[int], probs: list[float]) -> None:
    stat, df = chi_square(counts, probs)
    assert stat < CHI2_CRITICAL_0_001[df], (counts, probs, stat)


def histogram(tokens: list[int], vocab: int) -> list[int]:
    out = [0] * vocab
    for t in tokens:
        out[t] += 1
    return out


def sampled_outcomes(scale_rows: float = 1.0, seed: int = 1234) -> list[Verified]:
    rows = torch.tensor([P0, P1, P2], dtype=torch.float32) * scale_rows
    target = rows.repeat(N, 1)  # N sequences, 3 rows each
    gen = torch.Generator().manual_seed(seed)
    return verify_sampled([DRAFT] * N, target, [None] * N, gen)


def check_target_distribution(outcomes: list[Verified]) -> None:
    firsts = [v.token_ids[0] for v in outcomes]
    assert_follows(histogram(firsts, 6), P0)
    seconds = [v.token_ids[1] for v in outcomes if v.token_ids[0] == DRAFT[0]]
    assert_follows(histogram(seconds, 6), P1)
    thirds = [v.token_ids[2] for v in outcomes if v.token_ids[:2] == DRAFT]
    assert_follows(histogram(thirds, 6), P2)
    a, b = P0[DRAFT[0]], P1[DRAFT[1]]
    assert_follows(histogram([v.num_accepted for v in outcomes], 3), [1 - a, a * (1 - b), a * b])
    for v in outcomes:
        assert v.token_ids[: v.num_accepted] == DRAFT[: v.num_accepted]
        assert len(v.token_ids) == v.num_accepted + 1


def test_sampled_output_follows_the_target_distribution():
    check_target_distribution(sampled_outcomes())


def test_rows_need_not_be_normalised():
    check_target_distribution(sampled_outcomes(scale_rows=3.7, seed=99))


def test_the_chi_square_test_catches_resampling_that_keeps_the_draft():
    """Negative control: had the rejected draft stayed in the resampled distribution, the first
    token would follow p0(d) + (1 - p0(d)) p0 at d instead of p0."""
    firsts = histogram([v.token_ids[0] for v in sampled_outcomes()], 6)
    d = DRAFT[0]
    wrong = [(1 - P0[d]) * p + (P0[d] if t == d else 0.0) for t, p in enumerate(P0)]
    stat, df = chi_square(firsts, wrong)
    assert stat > 10 * CHI2_CRITICAL_0_001[df]


def test_independent_target_samples_compared_to_the_drafts_are_the_same_rule():
    """verify_greedy on one independent draw per row (the engine's ordinary sampler run on all
    k + 1 rows) gives the target distribution as well."""
    gen = torch.Generator().manual_seed(5)
    rows = torch.tensor([P0, P1, P2]).repeat(N, 1)
    draws = torch.multinomial(rows, 1, generator=gen).squeeze(1)
    check_target_distribution(verify_greedy([DRAFT] * N, draws))


def test_certain_and_impossible_drafts_and_the_bonus_token():
    certain = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    gen = torch.Generator().manual_seed(0)
    for v in verify_sampled([[1, 2]] * 50, certain.repeat(50, 1), [None] * 50, gen):
        assert v == Verified([1, 2, 0], 2)  # both accepted; the bonus from the last row
    impossible = torch.tensor([[0.5, 0.0, 0.5], [1.0, 0.0, 0.0]])
    outs = verify_sampled([[1]] * 200, impossible.repeat(200, 1), [None] * 200, gen)
    assert all(v.num_accepted == 0 and v.token_ids[0] in (0, 2) for v in outs)
    assert {v.token_ids[0] for v in outs} == {0, 2}
    # A sequence without drafts just samples its one row.
    lone = verify_sampled([[]], torch.tensor([[0.0, 0.0, 1.0]]), [None], gen)
    assert lone == [Verified([2], 0)]


def test_seeded_sequences_do_not_depend_on_the_batch():
    rows = torch.tensor([P0, P1, P2])

    def run(batch_before: int, seed: int = 42) -> Verified:
        drafts = [DRAFT] * (batch_before + 1)
        gens = [None] * batch_before + [torch.Generator().manual_seed(seed)]
        shared = torch.Generator().manual_seed(batch_before)
        return verify_sampled(drafts, rows.repeat(batch_before + 1, 1), gens, shared)[-1]

    alone = [run(0, seed) for seed in range(40)]
    assert [run(5, seed) for seed in range(40)] == alone
    assert len({tuple(v.token_ids) for v in alone}) > 3  # the seed matters


def test_greedy_accepts_the_matching_prefix_then_the_target_token():
    out = verify_greedy(
        [[5, 6, 7], [5, 6, 7], [5, 6, 7], []],
        torch.tensor([5, 6, 9, 1] + [5, 6, 7, 8] + [4, 6, 7, 8] + [3]),
    )
    assert out == [
        Verified([5, 6, 9], 2),
        Verified([5, 6, 7, 8], 3),  # all accepted: the bonus token
        Verified([4], 0),
        Verified([3], 0),
    ]


def test_rows_must_match_the_drafts():
    with pytest.raises(ValueError, match=r"sum\(k_i \+ 1\) = 3"):
        verify_greedy([[1, 2]], [1, 2])
    gen = torch.Generator()
    with pytest.raises(ValueError, match="draft token ids"):
        verify_sampled([[7]], torch.ones(2, 3), [None], gen)
    with pytest.raises(ValueError, match="one generator"):
        verify_sampled([[1]], torch.ones(2, 3), [], gen)


def toy_logits(context: list[int], vocab: int = 40) -> torch.Tensor:
    """A deterministic order-2 model whose greedy output falls into loops (lookup pays)
    and which has exact ties (the lowest id must win, as in plain decoding)."""
    g = torch.Generator().manual_seed(context[-1] * 1000 + context[-2])
    logits = torch.randint(0, 6, (vocab,), generator=g).float()
    return logits


def test_greedy_speculation_reproduces_plain_greedy_decoding():
    prompt = [3, 17, 4, 25, 3, 17, 9, 30, 11]
    max_tokens = 120
    plain = list(prompt)
    while len(plain) - len(prompt) < max_tokens:
        plain.append(int(toy_logits(plain).argmax()))

    config = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_max=3, prompt_lookup_min=2)
    proposer = NgramProposer(config)
    seq, steps, accepted = list(prompt), 0, 0
    while len(seq) - len(prompt) < max_tokens:
        room = draft_room(len(seq), len(seq) - len(prompt), max_tokens, max_model_len=10_000)
        draft = proposer.propose(0, seq, room)
        rows = torch.stack([toy_logits(seq + draft[:j]) for j in range(len(draft) + 1)])
        (v,) = verify_greedy([draft], rows.argmax(dim=-1))
        seq += v.token_ids
        steps += 1
        accepted += v.num_accepted
    assert seq == plain  # token for token, and never past max_tokens
    assert accepted > 20 and steps < max_tokens - 20  # speculation did take effect


def test_ties_are_broken_by_the_caller_s_argmax():
    """verify_greedy compares against the ids it is given, so plain and speculative decoding
    agree whenever both take the argmax with the same kernel."""
    logits = torch.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]])
    (v,) = verify_greedy([[2]], logits.argmax(dim=-1))
    assert v == Verified([1], 0)  # argmax takes the lowest id of a tie; draft 2 is rejected

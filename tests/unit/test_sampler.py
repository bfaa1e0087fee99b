"""The batched sampler on hand-made logits: distributions, penalties, seeds, greedy, min_tokens,
logprobs. No model; each test runs in milliseconds to a second."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from inferd.engine.sampling.penalties import apply_logit_processors
from inferd.engine.sampling.sampler import Sampler, SamplingRow, make_generator, prompt_logprobs
from inferd.sampling_params import SamplingParams

LOGITS = [1.2, 2.5, 0.3, 2.0, -1.0, 0.9, -0.2, 1.6]  # deliberately not sorted by id
N = 20000


def row(params: SamplingParams, out=(), prompt=(), gen=None, eos=(0,)) -> SamplingRow:
    return SamplingRow(params, list(prompt), list(out), gen, eos)


def reference(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> np.ndarray:
    """The filtered distribution, written from the definitions in float64."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    keep = np.ones(len(z), dtype=bool)
    if top_k > 0:
        keep &= z >= np.sort(z)[::-1][top_k - 1]
    p = np.where(keep, np.exp(z - z.max()), 0.0)
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        mass, nucleus = 0.0, []
        for t in order:  # smallest most-likely-first set whose mass reaches top_p
            nucleus.append(t)
            mass += p[t]
            if mass >= top_p:
                break
        keep &= np.isin(np.arange(len(z)), nucleus)
        p = np.where(keep, p, 0.0) / p[keep].sum()
    if min_p > 0.0:
        keep &= p >= min_p * p.max()
        p = np.where(keep, p, 0.0) / p[keep].sum()
    return p


CONFIGS = [
    dict(temperature=0.7),
    dict(top_k=3),
    dict(top_p=0.8),
    dict(min_p=0.2),
    dict(temperature=0.8, top_k=5, top_p=0.9, min_p=0.1),
]


def assert_matches(tokens: list[int], p: np.ndarray) -> None:
    freq = np.bincount(tokens, minlength=len(p)) / len(tokens)
    # Each frequency is binomial: allow 4.5 standard errors (a false alarm per comparison is
    # ~7e-6; the sampler's seed is fixed anyway), and exactly 0 where the filter removed a token.
    se = np.sqrt(p * (1 - p) / len(tokens))
    assert np.all(np.abs(freq - p) <= 4.5 * se + 1e-12), (freq, p)


# The same 8 logits plus a tail of 56 distinct lower ones holding about half of the mass, so
# that top-k changes what top-p sees and some kept sets are wider than a small candidate window.
WIDE = LOGITS + np.linspace(-1.0, 0.0, 56).tolist()


# candidates: 1024 holds the whole vocabulary (one full sort); 2 sends every filtered row of the
# 8-token vocabulary to the full-sort fallback; 16 on the wide vocabulary mixes both paths.
@pytest.mark.parametrize(("vocab", "candidates"), [(LOGITS, 1024), (LOGITS, 2), (WIDE, 16)])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_empirical_distribution_matches_filtered_softmax(cfg, vocab, candidates):
    p = reference(vocab, **cfg)
    assert (p > 0).sum() >= 2  # the config must leave a choice, or the test proves little
    logits = torch.tensor([vocab]).expand(N, -1)
    rows = [row(SamplingParams(**cfg))] * N
    tokens = Sampler(seed=1, candidates=candidates)(logits, rows).token_ids
    assert_matches(tokens, p)


def test_seeded_rows_follow_the_same_distribution():
    cfg = CONFIGS[-1]
    logits = torch.tensor([LOGITS]).expand(N, -1)
    rows = [row(SamplingParams(seed=i, **cfg), gen=make_generator(i)) for i in range(N)]
    assert_matches(Sampler(seed=0)(logits, rows).token_ids, reference(LOGITS, **cfg))


def test_wide_vocabulary_paths_keep_the_right_support():
    # V larger than the candidate window: a peaked row fits in the window, a flat one does not.
    vocab, n = 4096, 400
    peaked = torch.full((vocab,), -20.0)
    peaked[[7, 900, 4000]] = torch.tensor([3.0, 2.0, 1.0])
    flat = torch.linspace(0.0, 1.0, vocab)
    cases = [
        (peaked, dict(top_p=0.9), {7, 900}),
        # exp(x) over x = 0..1: the top half of the mass is x >= 0.620, and p >= 0.9 p_max is
        # x >= 1 + ln 0.9 = 0.895 (ids from 2539 and 3664; a few ids of slack below).
        (flat, dict(top_p=0.5), set(range(2535, vocab))),
        (flat, dict(top_k=100), set(range(vocab - 100, vocab))),
        (flat, dict(min_p=0.9), set(range(3660, vocab))),
    ]
    for logits, cfg, allowed in cases:
        rows = [row(SamplingParams(**cfg))] * n
        tokens = Sampler(seed=3, candidates=64)(logits.expand(n, -1), rows).token_ids
        assert set(tokens) <= allowed, cfg
        assert len(set(tokens)) > 1


def reference_processed(logits: list[float], r: SamplingRow) -> list[float]:
    """logit_bias → min_tokens → repetition → frequency/presence, as written in the docs."""
    p, out = r.params, list(r.output_token_ids)
    x = [float(v) for v in logits]
    for t, b in (p.logit_bias or {}).items():
        x[t] += b
    if len(out) < p.min_tokens:
        for t in list(p.stop_token_ids) + ([] if p.ignore_eos else list(r.eos_token_ids)):
            x[t] = -math.inf
    for t in set(r.prompt_token_ids) | set(out):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(out):
        x[t] -= p.frequency_penalty * out.count(t) + p.presence_penalty
    return x


def test_penalties_and_bias_match_reference():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 12, generator=g) * 2
    mixed = dict(repetition_penalty=0.7, frequency_penalty=1.0, presence_penalty=-0.4)
    mixed.update(logit_bias={3: 1.5}, min_tokens=4, stop_token_ids=[6])
    rows = [
        row(SamplingParams(repetition_penalty=1.3), prompt=[1, 2, 2, 9], out=[3, 3, 5]),
        row(SamplingParams(frequency_penalty=0.5, presence_penalty=0.3), out=[2, 2, 2, 7]),
        row(SamplingParams(frequency_penalty=-1.5, presence_penalty=0.0), out=[4, 4, 11]),
        row(SamplingParams(logit_bias={0: 5.0, 9: -2.5, 11: 100.0})),
        row(SamplingParams(), prompt=[1, 2], out=[3]),  # no knob: must stay bit-identical
        row(SamplingParams(**mixed), prompt=[3, 8, 10], out=[3, 8, 8], eos=(1, 2)),
    ]
    before = logits.clone()
    got = apply_logit_processors(logits, rows)
    assert torch.equal(logits, before)
    for i, r in enumerate(rows):
        want = torch.tensor(reference_processed(logits[i].tolist(), r), dtype=torch.float32)
        torch.testing.assert_close(got[i], want, rtol=1e-6, atol=1e-6)
        changed = ~torch.isclose(got[i], logits[i])
        assert changed.any() == (i != 4)
    assert torch.equal(got[4], logits[4])
    assert got[5, 1] == -math.inf and got[5, 6] == -math.inf
    # No processor in use: no copy at all.
    assert apply_logit_processors(logits, [row(SamplingParams())] * 6) is logits


def test_repetition_penalty_changes_greedy_choice():
    logits = torch.tensor([[1.0, 3.0, 2.9, -1.0]])
    plain = Sampler()(logits, [row(SamplingParams(temperature=0), prompt=[1])]).token_ids
    penal = row(SamplingParams(temperature=0, repetition_penalty=1.2), prompt=[1])
    assert plain == [1] and Sampler()(logits, [penal]).token_ids == [2]


OTHER_ROWS = [
    SamplingParams(),
    SamplingParams(seed=5, top_p=0.7),
    SamplingParams(temperature=0),
    SamplingParams(top_k=4, seed=8),
]


def run_steps(target, others_at, sampler, steps=20, vocab=100):
    """Sample `steps` tokens for the row `target` (params, seed), feeding them back as output,
    with other rows placed around it as others_at(step) says."""
    params, seed = target
    gen, out = make_generator(seed), []
    for s in range(steps):
        g = torch.Generator().manual_seed(1000 + s)  # the target row's logits at step s
        mine = torch.randn(vocab, generator=g) * 3
        before, after = others_at(s)
        noise = torch.randn(before + after, vocab, generator=g) * 3  # the neighbours
        logits = torch.cat([noise[:before], mine[None], noise[before:]])
        rows = [
            row(q, gen=None if q.seed is None else make_generator(q.seed))
            for q in OTHER_ROWS[: before + after]
        ]
        rows.insert(before, row(params, out=out, gen=gen))
        out.append(sampler(logits, rows).token_ids[before])
    return out


@pytest.mark.parametrize("candidates", [1024, 16])
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.9, seed=1234),
        SamplingParams(top_p=0.9, frequency_penalty=0.4, seed=1234),
        SamplingParams(top_k=20, min_p=0.05, repetition_penalty=1.1, seed=1234),
    ],
)
def test_seeded_row_is_batch_invariant(params, candidates):
    alone = run_steps((params, 1234), lambda s: (0, 0), Sampler(candidates=candidates))
    batched = run_steps(
        (params, 1234), lambda s: (s % 5, 4 - s % 5), Sampler(seed=7, candidates=candidates)
    )
    assert alone == batched
    assert len(set(alone)) > 3  # it really samples
    other_seed = run_steps((params, 4321), lambda s: (0, 0), Sampler(candidates=candidates))
    assert other_seed != alone


def test_greedy_is_argmax_whatever_the_filters():
    logits = torch.randn(16, 1000, generator=torch.Generator().manual_seed(2))
    logits[3, [10, 20]] = 50.0  # a tie: the lower id wins
    params = SamplingParams(temperature=0, top_k=2, top_p=0.1, min_p=0.9, seed=3)
    rows = [row(params, gen=make_generator(3)) for _ in range(16)]
    got = Sampler()(logits, rows).token_ids
    assert got == logits.argmax(-1).tolist()
    assert got[3] == 10


def test_min_tokens_holds_back_eos_and_stop_tokens():
    logits = torch.zeros(1, 10)
    logits[0, 0], logits[0, 5], logits[0, 7] = 10.0, 9.0, 8.0  # EOS 0, stop token 5
    greedy = SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[5])
    s = Sampler()
    assert s(logits, [row(greedy, out=[1, 1])]).token_ids == [7]
    assert s(logits, [row(greedy, out=[1, 1, 1])]).token_ids == [0]
    # ignore_eos: EOS is an ordinary token, so only the stop token is held back.
    no_eos = greedy.with_changes(ignore_eos=True)
    assert s(logits, [row(no_eos, out=[1])]).token_ids == [0]
    sampled = SamplingParams(min_tokens=2, stop_token_ids=[5])
    tokens = s(logits.expand(2000, -1), [row(sampled, out=[4])] * 2000).token_ids
    assert 0 not in tokens and 5 not in tokens and 7 in tokens


def test_callers_logits_are_not_modified():
    logits = torch.randn(6, 64, generator=torch.Generator().manual_seed(4))
    before = logits.clone()
    penalised = SamplingParams(repetition_penalty=1.5, frequency_penalty=1, presence_penalty=1)
    rows = [
        row(SamplingParams(temperature=0, logit_bias={3: 4.0}, logprobs=2)),
        row(penalised, prompt=[1, 2], out=[2, 3]),
        row(SamplingParams(top_k=5, top_p=0.5, min_p=0.1, temperature=0.5, logprobs=3)),
        row(SamplingParams(min_tokens=5, seed=3), gen=make_generator(3)),
        row(SamplingParams(top_p=0.9)),
        row(SamplingParams()),
    ]
    for candidates in (1024, 4):
        Sampler(candidates=candidates)(logits, rows)
        assert torch.equal(logits, before)
    Sampler()(logits, [row(SamplingParams(temperature=0))] * 6)
    assert torch.equal(logits, before)


def test_logprobs_are_raw_sorted_and_ranked():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, -2.0]] * 4)
    raw = torch.log_softmax(logits[0], -1)
    rows = [
        row(SamplingParams(temperature=0, logprobs=2)),  # picks id 1 (lowest of the tie)
        row(SamplingParams(temperature=0, logprobs=2, logit_bias={4: 100})),  # forced to 4
        row(SamplingParams(temperature=0, logprobs=0, logit_bias={5: 100})),  # forced to 5
        row(SamplingParams(temperature=0.3, top_k=1)),  # no logprobs asked
    ]
    result = Sampler()(logits, rows)
    assert result.token_ids[:3] == [1, 4, 5]
    first, forced, only = result.logprobs[:3]
    assert list(first) == [1, 2] and [lp.rank for lp in first.values()] == [1, 2]
    # The bias is not in the reported logprob, and the tie puts id 4 after ids 1 and 2.
    assert list(forced) == [4, 1, 2] and [lp.rank for lp in forced.values()] == [3, 1, 2]
    assert list(only) == [5] and only[5].rank == 6
    for entry in (first, forced, only):
        for t, lp in entry.items():
            assert lp.logprob == pytest.approx(raw[t].item(), abs=1e-7)
            assert lp.decoded_token is None
    assert result.logprobs[3] is None


def test_logprobs_match_brute_force_ranking():
    g = torch.Generator().manual_seed(6)
    ties = torch.randint(0, 4, (4, 300), generator=g).float()  # ~75 tokens share each value
    inside = -0.01 * torch.arange(300.0)
    inside[[9, 4]] = 5.0  # a tie among the top 5 but not at its boundary
    logits = torch.cat([torch.randn(4, 300, generator=g), ties, inside[None]])
    result = Sampler()(logits, [row(SamplingParams(temperature=1.5, logprobs=5))] * 9)
    lp = torch.log_softmax(logits, -1)
    for i, (tok, entry) in enumerate(zip(result.token_ids, result.logprobs, strict=True)):
        order = sorted(range(300), key=lambda t: (-lp[i, t].item(), t))
        want = [tok] + [t for t in order[:5] if t != tok]
        assert list(entry) == want
        assert [entry[t].rank for t in want] == [order.index(t) + 1 for t in want]
        assert [entry[t].logprob for t in want] == pytest.approx(lp[i, want].tolist(), abs=1e-7)


def test_prompt_logprobs():
    logits = torch.randn(7, 40, generator=torch.Generator().manual_seed(8))
    nxt = [3, 9, 9, 0, 39, 12, 5]
    got = prompt_logprobs(logits, nxt, 3)
    lp = torch.log_softmax(logits, -1)
    assert len(got) == 7
    for i, entry in enumerate(got):
        assert next(iter(entry)) == nxt[i]
        assert entry[nxt[i]].logprob == pytest.approx(lp[i, nxt[i]].item())
        assert {t for t in entry if entry[t].rank <= 3} == set(lp[i].topk(3).indices.tolist())
    with pytest.raises(ValueError, match="one next token per logits row"):
        prompt_logprobs(logits, nxt[:-1], 3)


def test_rejects_mismatched_rows():
    with pytest.raises(ValueError, match="one SamplingRow per logits row"):
        Sampler()(torch.zeros(2, 5), [row(SamplingParams())])
    assert Sampler()(torch.zeros(0, 5), []).token_ids == []


def test_argmax_kernel_agrees_with_torch_on_ties_and_nan(c_kernels):
    from inferd.engine.sampling.sampler import argmax_rows

    torch.manual_seed(0)
    x = torch.randn(6, 1000)
    x[1, [10, 700]] = 50.0  # a tie: the lowest index wins
    x[2, 999] = 60.0  # the last element
    x[3, [5, 300]] = float("nan")  # NaN counts as the maximum, first one
    x[4] = -float("inf")
    x[5, 0] = 70.0
    assert torch.equal(argmax_rows(x), x.argmax(dim=-1))
    assert torch.equal(argmax_rows(x[:, :37]), x[:, :37].argmax(dim=-1))  # not whole chunks

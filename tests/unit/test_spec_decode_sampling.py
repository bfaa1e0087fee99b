"""Sampling a verification step on fabricated logits: the sampler draws every row in one pass
(row j as if drafts 0..j-1 were output already), then the rejection pass
(`engine/scheduling/speculative.py: accept_drafts`) keeps the drafts while each equals its row's
token, with its own rows' logprobs; a seeded request draws exactly the tokens it draws without
speculation, its generator put back after a rejection."""

from __future__ import annotations

import torch

from inferd.engine.sampling.sampler import Sampler, SamplingRow, make_generator
from inferd.engine.scheduling.speculative import DraftedSample, accept_drafts
from inferd.sampling_params import SamplingParams

VOCAB = 50


def toy_logits(context: list[int]) -> torch.Tensor:
    """A fixed "model": logits after `context`, peaked enough that sampling often repeats it."""
    g = torch.Generator().manual_seed(hash(tuple(context[-3:])) % 2**31)
    logits = torch.randn(VOCAB, generator=g) * 3
    logits[(context[-1] * 7 + 3) % VOCAB] += 4
    return logits


class CountingSampler(Sampler):
    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed=seed)
        self.calls: list[int] = []

    def __call__(self, logits, rows):
        self.calls.append(len(rows))
        return super().__call__(logits, rows)


def rows_for(context, drafts, params, generator=None) -> list[SamplingRow]:
    """One row per draft plus one; the drafts before row j are output already."""
    keep = bool(drafts) and generator is not None
    return [SamplingRow(params, context, drafts[:j], generator, keep_generator_state=keep)
            for j in range(len(drafts) + 1)]  # fmt: skip


def rows_of(context: list[int], drafts: list[int]) -> torch.Tensor:
    return torch.stack([toy_logits(context + drafts[:j]) for j in range(len(drafts) + 1)])


def verify(sampler, logits, context, drafts, params, generator=None):
    result = sampler(logits, rows_for(context, drafts, params, generator))
    return accept_drafts(result, [DraftedSample(0, drafts, generator)])


def test_greedy_keeps_matching_drafts_then_the_row_token_with_its_logprobs():
    context = [1, 2, 3]
    greedy = SamplingParams(temperature=0, logprobs=1)
    plain = []
    for _ in range(3):
        plain.append(int(toy_logits(context + plain).argmax()))
    drafts = plain[:2] + [(plain[2] + 1) % VOCAB, 4]  # two right, the third wrong
    logits = rows_of(context, drafts)
    sampler = CountingSampler()
    tokens, logprobs = verify(sampler, logits, context, drafts, greedy)
    assert tokens == [plain]
    assert sampler.calls == [5]  # every row in one call
    for j, token in enumerate(plain):
        expected = torch.log_softmax(logits[j], dim=-1)[token].item()
        assert abs(logprobs[0][j][token].logprob - expected) < 1e-5
    # No logprobs asked: None, as for plain decoding.
    quiet = SamplingParams(temperature=0)
    assert verify(Sampler(), logits, context, drafts, quiet)[1] == [None]


def test_sampled_rows_are_one_pass_and_a_rejection_ends_the_tokens_there():
    context = [4, 5, 6]
    params = SamplingParams(temperature=1.0)
    logits = torch.full((3, VOCAB), -1e9)
    logits[0, 7] = logits[1, 8] = 0.0  # rows 0 and 1 are certain: 7, then 8
    logits[2, 9] = 0.0
    sampler = CountingSampler()
    assert verify(sampler, logits, context, [7, 8], params)[0] == [[7, 8, 9]]
    assert verify(sampler, logits, context, [3, 8], params)[0] == [[7]]  # rejected at once
    assert sampler.calls == [3, 3]  # one pass each, whatever is kept


def test_a_seeded_request_draws_the_tokens_of_plain_decoding():
    context = [7, 8, 9]
    params = SamplingParams(temperature=1.0, seed=1234)
    plain, generator = [], make_generator(1234)
    for _ in range(9):
        row = SamplingRow(params, context, list(plain), generator)
        plain += Sampler(seed=99)(toy_logits(context + plain)[None], [row]).token_ids
    # Drafts right at first, then wrong: the emitted tokens are plain decoding's all the same,
    # and the generator is left where plain decoding leaves it after them.
    drafts = plain[:3] + [(plain[3] + 1) % VOCAB, plain[4]]
    generator = make_generator(1234)
    tokens, _ = verify(Sampler(seed=5), rows_of(context, drafts), context, drafts, params,
                       generator)  # fmt: skip
    assert tokens == [plain[:4]]
    out = plain[:4]
    for _ in range(5):  # plain decoding from there on draws the rest of `plain`
        row = SamplingRow(params, context, list(out), generator)
        out += Sampler(seed=7)(toy_logits(context + out)[None], [row]).token_ids
    assert out == plain


def test_a_seeded_requests_rows_draw_in_row_order_whatever_their_path():
    # Filtered rows take different paths by their logits (a narrow window, or the whole
    # vocabulary when the kept set does not fit in it): the draws stay in row order.
    vocab = 64
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=3)
    context = [1]
    wide, narrow = torch.zeros(vocab), torch.zeros(vocab)
    narrow[5] = 30.0  # all the mass on one token: fits in a window of 4
    logits = torch.stack([wide, narrow, wide])
    drafts = []
    plain, g = [], make_generator(3)
    for j in range(3):
        row = SamplingRow(params, context, list(plain), g)
        plain += Sampler(candidates=4)(logits[j][None], [row]).token_ids
    drafts = plain[:2]  # both right: all three rows are emitted
    tokens, _ = verify(Sampler(candidates=4), logits, context, drafts, params, make_generator(3))
    assert tokens == [plain]


def test_penalties_count_the_drafts_before_a_row_as_output():
    context = [1, 2, 3]
    params = SamplingParams(temperature=0, presence_penalty=2.0, frequency_penalty=1.0)
    drafts = [11, 11]
    logits = torch.zeros(3, VOCAB)
    logits[:, 11] = 2.5  # 11 wins unless penalised as output: by 3 after one, by 6 after two
    logits[:, 12] = 1.0
    tokens, _ = verify(Sampler(), logits, context, drafts, params)
    assert tokens == [[11, 12]]  # row 0: no output yet; row 1: 11 already output once


def test_samples_of_a_batch_read_their_own_rows():
    greedy = SamplingParams(temperature=0)
    logits = torch.zeros(4, VOCAB)
    logits[0, 3] = logits[1, 4] = logits[2, 5] = logits[3, 6] = 1.0
    rows = rows_for([1, 2, 3], [3], greedy) + rows_for([1, 2, 3], [], greedy) * 2
    samples = [DraftedSample(0, [3]), DraftedSample(2, []), DraftedSample(3, [])]
    tokens, _ = accept_drafts(Sampler()(logits, rows), samples)
    assert tokens == [[3, 4], [5], [6]]

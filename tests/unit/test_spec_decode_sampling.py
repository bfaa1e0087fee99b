"""Sampling a verification step (`engine/speculative.py: sample_drafted`) on fabricated logits:
greedy rows all at once, sampled rows one round at a time, emitted tokens with their own rows'
logprobs, drafts counted as output by the penalties, and a seeded request drawing exactly the
tokens it draws without speculation."""

from __future__ import annotations

import torch

from inferd.engine.sampler import Sampler, SamplingRow, make_generator
from inferd.engine.speculative import DraftedSample, sample_drafted
from inferd.sampling_params import SamplingParams

VOCAB = 50


def toy_logits(context: list[int]) -> torch.Tensor:
    """A fixed "model": logits after `context`, peaked enough that sampling often repeats it."""
    g = torch.Generator().manual_seed(hash(tuple(context[-3:])) % 2**31)
    logits = torch.randn(VOCAB, generator=g) * 3
    logits[(context[-1] * 7 + 3) % VOCAB] += 4
    return logits


class CountingSampler(Sampler):
    def __init__(self) -> None:
        super().__init__(seed=0)
        self.calls: list[int] = []

    def __call__(self, logits, rows):
        self.calls.append(len(rows))
        return super().__call__(logits, rows)


def drafted(context, drafts, params, generator=None, first=0) -> DraftedSample:
    def row(j: int) -> SamplingRow:  # the drafts before row j are output already
        return SamplingRow(params, context, drafts[:j], generator)

    return DraftedSample(first, drafts, row)


def rows_of(context: list[int], drafts: list[int]) -> torch.Tensor:
    return torch.stack([toy_logits(context + drafts[:j]) for j in range(len(drafts) + 1)])


def test_greedy_keeps_matching_drafts_then_the_row_token_with_its_logprobs():
    context = [1, 2, 3]
    greedy = SamplingParams(temperature=0, logprobs=1)
    plain = []
    for _ in range(3):
        plain.append(int(toy_logits(context + plain).argmax()))
    drafts = plain[:2] + [(plain[2] + 1) % VOCAB, 4]  # two right, the third wrong
    logits = rows_of(context, drafts)
    sampler = CountingSampler()
    tokens, logprobs = sample_drafted(sampler, logits, [drafted(context, drafts, greedy)])
    assert tokens == [plain]
    assert sampler.calls == [5]  # every row in one call
    for j, token in enumerate(plain):
        expected = torch.log_softmax(logits[j], dim=-1)[token].item()
        assert abs(logprobs[0][j][token].logprob - expected) < 1e-5
    # No logprobs asked: None, as for plain decoding.
    quiet = drafted(context, drafts, SamplingParams(temperature=0))
    assert sample_drafted(Sampler(), logits, [quiet])[1] == [None]


def test_sampled_rows_are_drawn_one_round_at_a_time_and_only_while_needed():
    context = [4, 5, 6]
    params = SamplingParams(temperature=1.0)
    logits = torch.full((3, VOCAB), -1e9)
    logits[0, 7] = logits[1, 8] = 0.0  # rows 0 and 1 are certain: 7, then 8
    logits[2, 9] = 0.0
    sampler = CountingSampler()
    tokens, _ = sample_drafted(sampler, logits, [drafted(context, [7, 8], params)])
    assert tokens == [[7, 8, 9]] and sampler.calls == [1, 1, 1]
    sampler = CountingSampler()
    tokens, _ = sample_drafted(sampler, logits, [drafted(context, [3, 8], params)])
    assert tokens == [[7]] and sampler.calls == [1]  # rejected at once: one draw in all


def test_a_seeded_request_draws_the_tokens_of_plain_decoding():
    context = [7, 8, 9]
    params = SamplingParams(temperature=1.0, seed=1234)
    plain, generator = [], make_generator(1234)
    for _ in range(6):
        row = SamplingRow(params, context, list(plain), generator)
        plain += Sampler(seed=99)(toy_logits(context + plain)[None], [row]).token_ids
    # Drafts right at first, then wrong: the emitted tokens are plain decoding's all the same.
    drafts = plain[:3] + [(plain[3] + 1) % VOCAB, plain[4]]
    generator = make_generator(1234)
    tokens, _ = sample_drafted(
        Sampler(seed=5), rows_of(context, drafts), [drafted(context, drafts, params, generator)]
    )
    assert tokens == [plain[:4]]


def test_penalties_count_the_drafts_before_a_row_as_output():
    context = [1, 2, 3]
    params = SamplingParams(temperature=0, presence_penalty=2.0, frequency_penalty=1.0)
    drafts = [11, 11]
    logits = torch.zeros(3, VOCAB)
    logits[:, 11] = 2.5  # 11 wins unless penalised as output: by 3 after one, by 6 after two
    logits[:, 12] = 1.0
    tokens, _ = sample_drafted(Sampler(), logits, [drafted(context, drafts, params)])
    assert tokens == [[11, 12]]  # row 0: no output yet; row 1: 11 already output once


def test_samples_of_a_batch_read_their_own_rows():
    greedy = SamplingParams(temperature=0)
    logits = torch.zeros(4, VOCAB)
    logits[0, 3] = logits[1, 4] = logits[2, 5] = logits[3, 6] = 1.0
    samples = [drafted([1, 2, 3], [3], greedy, first=0), drafted([1, 2, 3], [], greedy, first=2),
               drafted([1, 2, 3], [], greedy, first=3)]  # fmt: skip
    tokens, _ = sample_drafted(Sampler(), logits, samples)
    assert tokens == [[3, 4], [5], [6]]

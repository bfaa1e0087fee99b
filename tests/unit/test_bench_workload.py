"""The random-token workload generator (lengths, vocabulary, determinism), the copy workload
(edit prompts of a target length), the presets of the standard workloads, latency batches and
Poisson arrival gaps. No model is loaded."""

from __future__ import annotations

import math
import random
import re
from dataclasses import replace

import numpy as np
import pytest

from inferd.bench.copy_text import TYPO_RATE, _with_typos, edit_prompt, edit_sentences
from inferd.bench.latency import latency_batches
from inferd.bench.presets import resolve_workload
from inferd.bench.serve import arrival_gaps
from inferd.bench.throughput import round_workloads
from inferd.bench.workload import (
    LengthRange,
    WorkloadSpec,
    _shortest_prompt_reaching,
    copy_requests,
    make_requests,
    ordinary_token_ids,
    random_requests,
    workload_vocab,
)

SPECIAL = [0, 1, 2, 3, 106, 999]
VOCAB = ordinary_token_ids(1000, SPECIAL)


def spec(n=200, inp=(16, 256), out=(16, 128), seed=0) -> WorkloadSpec:
    return WorkloadSpec(n, LengthRange(*inp), LengthRange(*out), seed=seed)


def test_range_ratio_bounds_as_vllm():
    assert LengthRange.around(128, 0.0) == LengthRange(128, 128)
    assert LengthRange.around(100, 0.5) == LengthRange(50, 150)
    assert LengthRange.around(10, 0.25) == LengthRange(7, 13)  # floor 7.5, ceil 12.5
    # The workload written as center ± ratio lands exactly on its bounds.
    assert LengthRange.around(136, 120 / 136) == LengthRange(16, 256)
    assert LengthRange.around(72, 56 / 72) == LengthRange(16, 128)
    assert LengthRange.around(1, 0.9).low == 1  # never a zero-length prompt
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="range_ratio"):
            LengthRange.around(10, bad)
    with pytest.raises(ValueError):
        LengthRange(5, 4)


def test_ordinary_ids_skip_special_tokens():
    assert VOCAB.size == 1000 - len(SPECIAL)
    assert not set(SPECIAL) & set(VOCAB.tolist())
    assert ordinary_token_ids(10, [3, 12, -1]).tolist() == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    with pytest.raises(ValueError, match="no ordinary tokens"):
        ordinary_token_ids(2, [0, 1])


def test_lengths_within_bounds_exact_counts_and_both_ends_reached():
    reqs = random_requests(spec(n=2000), VOCAB)
    assert len(reqs) == 2000
    ins = [r.prompt_len for r in reqs]
    outs = [r.output_len for r in reqs]
    assert min(ins) == 16 and max(ins) == 256
    assert min(outs) == 16 and max(outs) == 128
    assert all(len(r.prompt_token_ids) == r.prompt_len for r in reqs)


def test_prompts_hold_only_ordinary_python_int_ids():
    reqs = random_requests(spec(), VOCAB)
    ids = [t for r in reqs for t in r.prompt_token_ids]
    assert not set(SPECIAL) & set(ids)
    assert all(type(t) is int for t in ids)  # the engine rejects numpy integers
    assert min(ids) >= 0 and max(ids) < 1000


def test_deterministic_for_a_seed_and_different_across_seeds():
    a, b = random_requests(spec(seed=7), VOCAB), random_requests(spec(seed=7), VOCAB)
    assert a == b
    c = random_requests(spec(seed=8), VOCAB)
    assert [r.prompt_token_ids for r in a] != [r.prompt_token_ids for r in c]


def test_fixed_lengths_are_exact():
    reqs = random_requests(spec(n=5, inp=(512, 512), out=(1, 1)), VOCAB)
    assert [(r.prompt_len, r.output_len) for r in reqs] == [(512, 1)] * 5


def test_vocab_from_a_tokenizer():
    class FakeTokenizer:
        all_special_ids = [0, 5]

        def __len__(self):
            return 8

    assert workload_vocab(FakeTokenizer()).tolist() == [1, 2, 3, 4, 6, 7]


def test_presets_are_the_standard_workloads_and_flags_override_them():
    kw = dict(input_len=None, output_len=None, range_ratio=0.0, num_prompts=None, seed=0)
    t = resolve_workload("throughput32", default_prompts=1, **kw)
    assert (t.num_prompts, t.input_len, t.output_len) == (
        32,
        LengthRange(16, 256),
        LengthRange(16, 128),
    )
    s = resolve_workload("single", default_prompts=9, **kw)
    assert (s.num_prompts, s.input_len, s.output_len) == (
        1,
        LengthRange(128, 128),
        LengthRange(128, 128),
    )
    p = resolve_workload("prefill512", default_prompts=9, **kw)
    assert (p.input_len, p.output_len) == (LengthRange(512, 512), LengthRange(1, 1))
    o = resolve_workload("throughput32", default_prompts=1, **{**kw, "output_len": 64})
    assert o.output_len == LengthRange(64, 64) and o.input_len == LengthRange(16, 256)
    d = resolve_workload(None, default_prompts=3, **kw)
    assert (d.num_prompts, d.input_len) == (3, LengthRange(128, 128))
    with pytest.raises(ValueError, match="preset"):
        resolve_workload("nope", default_prompts=1, **kw)


def test_latency_batches_have_fresh_prompts_of_the_same_lengths():
    base = replace(spec(n=4, inp=(64, 64), out=(8, 8)), seed=3)
    warm, measured = latency_batches(base, VOCAB, num_warmup=2, num_iters=3)
    assert len(warm) == 2 and len(measured) == 3
    batches = warm + measured
    assert all(len(b) == 4 and all(r.prompt_len == 64 for r in b) for b in batches)
    firsts = [tuple(b[0].prompt_token_ids) for b in batches]
    assert len(set(firsts)) == len(firsts)  # no repeat for a prefix cache to hit
    assert latency_batches(base, VOCAB, 2, 3) == (warm, measured)


def test_poisson_arrival_gaps():
    assert arrival_gaps(4, math.inf, seed=0) == [0.0] * 4
    gaps = arrival_gaps(20001, 4.0, seed=1)
    assert gaps[0] == 0.0 and gaps == arrival_gaps(20001, 4.0, seed=1)
    assert np.mean(gaps[1:]) == pytest.approx(0.25, rel=0.05)  # mean gap 1/rate
    assert np.std(gaps[1:]) == pytest.approx(0.25, rel=0.05)  # exponential: std = mean
    with pytest.raises(ValueError, match="request-rate"):
        arrival_gaps(3, 0.0, seed=0)


def test_throughput_rounds_draw_fresh_prompts_and_round_one_is_the_plain_workload():
    base = spec(n=6, seed=5)
    rounds = round_workloads(base, VOCAB, 3)
    assert rounds[0] == random_requests(base, VOCAB)
    assert len({tuple(r[0].prompt_token_ids) for r in rounds}) == 3
    with pytest.raises(ValueError, match="rounds"):
        round_workloads(base, VOCAB, 0)


class WordTokenizer:
    """A stand-in tokenizer: one id per word or punctuation mark, plus BOS."""

    def encode(self, text: str) -> list[int]:
        return [2] + [len(w) + 10 for w in re.findall(r"\w+|[^\w\s]", text)]


def test_copy_preset_is_a_single_stream_edit_workload():
    kw = dict(input_len=None, output_len=None, range_ratio=0.0, num_prompts=None, seed=0)
    c = resolve_workload("copy", default_prompts=9, **kw)
    assert (c.num_prompts, c.input_len, c.output_len, c.dataset) == (
        1,
        LengthRange(256, 256),
        LengthRange(192, 192),
        "copy",
    )
    assert c.to_dict()["dataset"] == "copy"
    assert resolve_workload("single", default_prompts=1, **kw).dataset == "random"
    with pytest.raises(ValueError, match="dataset must be one of random, copy"):
        replace(c, dataset="sharegpt")


def test_copy_prompts_are_the_shortest_whole_sentence_prompts_reaching_the_length():
    tok = WordTokenizer()
    spec = WorkloadSpec(6, LengthRange(120, 400), LengthRange(50, 60), seed=3, dataset="copy")
    reqs = copy_requests(spec, tok)
    assert len(reqs) == 6 and all(50 <= r.output_len <= 60 for r in reqs)
    assert len({tuple(r.prompt_token_ids) for r in reqs}) == 6  # a fresh text per request
    rng = random.Random(spec.seed)
    targets = [rng.randint(120, 400) for _ in range(6)]
    for r, target in zip(reqs, targets, strict=True):
        assert r.prompt_len >= target
        assert all(type(t) is int for t in r.prompt_token_ids)
    assert copy_requests(spec, tok) == reqs
    assert copy_requests(replace(spec, seed=4), tok) != reqs
    # Minimal: one sentence fewer would fall short of the length.
    sentences = edit_sentences(random.Random(0), 40)
    for target in (30, 200, 333):
        got = _shortest_prompt_reaching(sentences, target, tok)
        count = next(m for m in range(1, 41) if tok.encode(edit_prompt(sentences[:m])) == got)
        assert len(got) >= target
        assert count == 1 or len(tok.encode(edit_prompt(sentences[: count - 1]))) < target


def test_edit_text_is_deterministic_prose_with_typos_to_fix():
    a = edit_sentences(random.Random(11), 30)
    assert a == edit_sentences(random.Random(11), 30)
    assert a[:10] == edit_sentences(random.Random(11), 10)  # a prefix of a longer text
    assert a[0].startswith("The town council of ")
    assert "".join(a).count("\n\n") >= 5  # paragraphs
    prompt = edit_prompt(a)
    assert prompt.startswith('Original text:\n"""\n') and prompt.endswith('fixed:\n"""\n')


def test_typos_swap_two_inner_letters_of_a_few_long_words():
    sentence = " ".join(["abcdefgh"] * 2000)
    typed = _with_typos(random.Random(0), sentence).split(" ")
    changed = [w for w in typed if w != "abcdefgh"]
    assert len(changed) == pytest.approx(2000 * TYPO_RATE, rel=0.3)
    for w in changed:
        i = next(j for j in range(8) if w[j] != "abcdefgh"[j])
        assert (
            1 <= i <= 5
            and w == "abcdefgh"[:i] + "abcdefgh"[i + 1] + "abcdefgh"[i] + "abcdefgh"[i + 2 :]
        )
    assert _with_typos(random.Random(0), "a an the of it") == "a an the of it"  # short words stay


def test_make_requests_dispatches_on_the_dataset_and_latency_batches_take_the_tokenizer():
    random_spec = spec(n=3, seed=1)
    assert make_requests(random_spec, VOCAB, None) == random_requests(random_spec, VOCAB)
    copy_spec = replace(random_spec, dataset="copy", input_len=LengthRange(80, 80))
    assert make_requests(copy_spec, VOCAB, WordTokenizer()) == copy_requests(
        copy_spec, WordTokenizer()
    )
    warm, measured = latency_batches(copy_spec, VOCAB, 1, 2, tokenizer=WordTokenizer())
    firsts = [tuple(b[0].prompt_token_ids) for b in warm + measured]
    assert len(set(firsts)) == 3


def test_copy_prompts_reach_the_length_with_a_tokenizer_of_few_tokens_per_sentence():
    class FirstWordsTokenizer:  # about 4 tokens per sentence
        def encode(self, text: str) -> list[int]:
            return [len(s.split()[0]) for s in re.split(r"[.\n]", text) if s.strip()] * 4

    spec = WorkloadSpec(2, LengthRange(900, 900), LengthRange(8, 8), dataset="copy")
    assert all(r.prompt_len >= 900 for r in copy_requests(spec, FirstWordsTokenizer()))


def test_the_multiturn_preset_resends_each_conversations_history():
    from inferd.bench.workload import USER_TURN_TOKENS, conversations

    spec = resolve_workload("multiturn", input_len=None, output_len=None, range_ratio=0.0,
                            num_prompts=None, seed=3, default_prompts=64)  # fmt: skip
    assert (spec.num_prompts, spec.turns, spec.dataset) == (16, 6, "multiturn")
    talks = conversations(spec, VOCAB)
    assert len(talks) == 16 and all(len(turns) == 6 for turns in talks)
    for turns in talks:
        assert 128 <= turns[0].prompt_len <= 384 and all(32 <= t.output_len <= 96 for t in turns)
        for before, after in zip(turns, turns[1:]):  # the history, then answer and question
            assert after.prompt_token_ids[: before.prompt_len] == before.prompt_token_ids
            assert after.prompt_len == before.prompt_len + before.output_len + USER_TURN_TOKENS
    # Lengths vary (presets.py: fixed ones put a replica's conversations in lock step).
    assert len({t.output_len for turns in talks for t in turns}) > 10
    assert len({turns[0].prompt_len for turns in talks}) > 10
    assert talks[0][0].prompt_token_ids != talks[1][0].prompt_token_ids
    assert conversations(spec, VOCAB)[5][4] == talks[5][4]  # deterministic
    assert len(make_requests(spec, VOCAB, None)) == 16 * 6

"""The random-token workload generator (lengths, vocabulary, determinism), the presets of the
standard workloads, latency batches and Poisson arrival gaps. No model is loaded."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from inferd.bench.latency import latency_batches
from inferd.bench.presets import resolve_workload
from inferd.bench.serve import arrival_gaps
from inferd.bench.throughput import round_workloads
from inferd.bench.workload import (
    LengthRange,
    WorkloadSpec,
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

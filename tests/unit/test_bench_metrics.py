"""Benchmark metric arithmetic from synthetic timestamps: TTFT, TPOT (vLLM's definition, with
single-token requests left out), ITL from chunk times, the summary statistics and throughputs.
No clocks are read: every time is made up."""

from __future__ import annotations

import math

import numpy as np
import pytest

from inferd.bench.metrics import (
    RequestTiming,
    compute_metrics,
    count_mismatches,
    summarize,
)


def timing(start=10.0, first=10.25, end=11.25, prompt=8, out=5, chunks=(), error=None):
    return RequestTiming(start, first, end, prompt, out, tuple(chunks), error)


def test_ttft_e2el_tpot_of_one_request():
    t = timing(start=10.0, first=10.25, end=11.25, out=5)
    assert t.ttft == pytest.approx(0.25)
    assert t.e2el == pytest.approx(1.25)
    # (E2EL − TTFT) / (out − 1) = 1.0 / 4: the first token is not a "per output token" step.
    assert t.tpot == pytest.approx(0.25)


def test_tpot_is_undefined_for_one_output_token_and_left_out_of_the_stats():
    single = timing(start=0.0, first=0.5, end=0.5, out=1)
    assert single.tpot is None
    pair = timing(start=0.0, first=0.2, end=0.5, out=2)
    assert pair.tpot == pytest.approx(0.3)
    m = compute_metrics([single, pair], duration=1.0)
    assert m.tpot.count == 1 and m.tpot.mean == pytest.approx(0.3)  # not averaged with a 0
    assert m.ttft.count == 2 and m.ttft.mean == pytest.approx(0.35)
    only_single = compute_metrics([single], duration=1.0)
    assert only_single.tpot is None and only_single.to_dict()["tpot_ms"] is None


def test_no_first_token_means_no_ttft_or_tpot():
    t = timing(first=None)
    assert t.ttft is None and t.tpot is None


def test_itl_is_the_gaps_between_chunks_pooled_over_requests():
    a = timing(start=0.0, first=1.0, end=1.6, out=4, chunks=(1.0, 1.1, 1.3, 1.6))
    b = timing(start=0.0, first=2.0, end=2.5, out=2, chunks=(2.0, 2.5))
    assert a.itl == pytest.approx([0.1, 0.2, 0.3])
    m = compute_metrics([a, b, timing()], duration=3.0)  # the third did not stream: no gaps
    assert m.itl.count == 4
    assert m.itl.mean == pytest.approx((0.1 + 0.2 + 0.3 + 0.5) / 4)
    assert m.itl.median == pytest.approx(0.25)
    assert compute_metrics([timing()], duration=1.0).itl is None


def test_summary_statistics_match_hand_values_and_numpy():
    s = summarize([4.0, 1.0, 3.0, 2.0], percentiles=(50, 90))
    assert s.count == 4 and s.mean == pytest.approx(2.5) and s.median == pytest.approx(2.5)
    assert s.std == pytest.approx(math.sqrt(1.25))  # population std, not the sample std
    # Linear interpolation: position 0.99·(4−1) = 2.97 → 3 + 0.97·(4 − 3).
    assert s.p99 == pytest.approx(3.97)
    assert s.percentiles[90.0] == pytest.approx(3.7)
    assert sorted(s.percentiles) == [50.0, 90.0, 99.0]  # p99 is always there
    data = np.random.default_rng(3).lognormal(size=1001)
    s = summarize(data.tolist(), percentiles=(10, 50, 75))
    for p in (10, 50, 75, 99):
        assert s.percentiles[float(p)] == pytest.approx(np.percentile(data, p))
    assert s.std == pytest.approx(np.std(data)) and s.median == pytest.approx(np.median(data))


def test_summary_of_nothing_is_none_not_zero():
    assert summarize([]) is None


def test_throughputs_and_failed_requests():
    ok = [timing(prompt=10, out=5), timing(prompt=20, out=1), timing(prompt=30, out=4)]
    failed = timing(prompt=1000, out=0, first=None, error="HTTP 500")
    m = compute_metrics([*ok, failed], duration=2.0)
    assert (m.completed, m.failed) == (3, 1)
    assert (m.total_input_tokens, m.total_output_tokens) == (60, 10)
    assert m.request_throughput == pytest.approx(1.5)
    assert m.output_throughput == pytest.approx(5.0)
    assert m.total_token_throughput == pytest.approx(35.0)
    assert m.e2el.count == 3  # the failed request adds no latency sample


def test_json_form_is_in_milliseconds():
    d = compute_metrics([timing(start=0.0, first=0.25, end=1.25, out=5)], duration=2.0).to_dict()
    assert d["ttft_ms"]["median"] == pytest.approx(250.0)
    assert d["tpot_ms"]["p99"] == pytest.approx(250.0)
    assert d["e2el_ms"]["mean"] == pytest.approx(1250.0)
    assert d["output_throughput"] == pytest.approx(2.5)


def test_zero_duration_gives_zero_throughput_not_an_error():
    assert compute_metrics([timing()], duration=0.0).output_throughput == 0.0


def test_requests_that_made_the_wrong_count_are_flagged():
    timings = [timing(out=5), timing(out=3), timing(out=0, error="boom")]
    assert count_mismatches(timings, [5, 4, 7]) == [
        "1 request(s) produced a different number of tokens than asked"
    ]
    assert count_mismatches(timings[:1], [5]) == []

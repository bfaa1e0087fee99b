"""Speculative decoding counters under vLLM's names, and the rates derived from them."""

from __future__ import annotations

import pytest

from inferd.spec_decode import SpecDecodeMetrics


def test_counters_rates_and_per_position_counts():
    m = SpecDecodeMetrics(num_speculative_tokens=4)
    assert m.acceptance_rate is None and m.mean_acceptance_length is None
    m.observe(4, 4)
    m.observe(4, 1)
    m.observe(2, 0)
    m.observe(0, 0)  # a step without drafts is not a draft
    assert m.counters() == {
        "spec_decode_num_drafts": 3,
        "spec_decode_num_draft_tokens": 10,
        "spec_decode_num_accepted_tokens": 5,
        "spec_decode_num_accepted_tokens_per_pos": [2, 1, 1, 1],
    }
    assert m.acceptance_rate == pytest.approx(0.5)
    assert m.mean_acceptance_length == pytest.approx(1 + 5 / 3)  # tokens per verification
    assert m.acceptance_rate_per_pos == pytest.approx([2 / 3, 1 / 3, 1 / 3, 1 / 3])


def test_merge_adds_counts_and_bad_observations_are_refused():
    a, b = SpecDecodeMetrics(2), SpecDecodeMetrics(2)
    a.observe(2, 1)
    b.observe(2, 2)
    a.merge(b)
    assert a.counters()["spec_decode_num_accepted_tokens_per_pos"] == [2, 1]
    assert (a.num_drafts, a.num_draft_tokens, a.num_accepted_tokens) == (2, 4, 3)
    with pytest.raises(ValueError, match="different num_speculative_tokens"):
        a.merge(SpecDecodeMetrics(3))
    for drafted, accepted in [(3, 0), (2, 3), (1, -1)]:
        with pytest.raises(ValueError, match="num_accepted"):
            a.observe(drafted, accepted)

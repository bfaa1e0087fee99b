"""The draft planner: per-sequence acceptance estimates (with shadow drafts), the measured cost of
a step by its rows, and the choice of how many drafts to verify (expected tokens per second)."""

from __future__ import annotations

import pytest

from inferd.spec_decode import AcceptanceEstimate, StepCosts, plan_drafts
from inferd.spec_decode.planner import STALE_AFTER


def costs_of(table: dict[int, float]) -> StepCosts:
    costs = StepCosts()
    for rows, seconds in table.items():
        costs.record(rows, seconds)
    return costs


# Measured on the embedded model, one CPU thread (ms): two rows cost little more than one, every
# further row about half a step (block kernels bound by arithmetic past two rows).
CPU = {1: 12.0, 2: 14.0, 3: 22.9, 4: 30.0, 5: 39.5}
FLAT = {1: 10.0, 5: 10.5}  # a GPU-like machine: rows nearly free


def test_estimate_counts_accepted_drafts_and_the_first_rejection():
    e = AcceptanceEstimate()
    assert e.p == 0.5  # the prior
    for _ in range(20):
        e.observe(4, 4)  # four successes, no failure
    assert e.p > 0.97
    for _ in range(20):
        e.observe(4, 0)  # one failure each: the later drafts were never tried
    assert e.p < 0.1
    e.observe(0, 0)  # nothing drafted: nothing learnt
    with pytest.raises(ValueError, match="num_accepted"):
        e.observe(2, 3)


def test_a_shadow_is_scored_once_decided_by_the_tokens_that_follow():
    e = AcceptanceEstimate()
    e.set_shadow([5, 6, 7], at=10)
    e.set_shadow([9, 9], at=11)  # one pending shadow at a time
    tokens = list(range(10)) + [5]
    e.score_shadow(tokens)
    assert e.shadow  # 5 matched, 6 not arrived yet: undecided
    e.score_shadow(tokens + [6, 7])
    assert not e.shadow and e.p == pytest.approx((0.8 * 1 + 3) / (0.8 * 2 + 3))
    e.set_shadow([1, 2], at=13)
    e.score_shadow(tokens + [6, 7, 3])  # first token wrong: decided, one failure
    assert not e.shadow and e.trials == pytest.approx(0.8 * (0.8 * 2 + 3) + 1)


def test_costs_interpolate_and_extrapolate_optimistically():
    costs = costs_of({1: 10.0, 3: 20.0})
    assert costs.seconds(1) == 10.0 and costs.seconds(2) == 15.0
    assert costs.seconds(5) == pytest.approx(20.0 * (1 + 0.25 * 2 / 3))  # untried: cheap-ish
    assert StepCosts().seconds(3) == pytest.approx(1.5)  # nothing measured: a unit model
    below = costs_of({4: 8.0})
    assert below.seconds(2) == 4.0  # proportional below the smallest measured
    costs.record(3, 30.0)
    costs.record(3, 40.0)
    assert costs.seconds(3) == 30.0  # the median of the recent ones


def test_a_cost_not_measured_lately_counts_as_unmeasured():
    costs = costs_of({1: 10.0, 2: 100.0})  # 2 rows measured once, at a busy moment
    for _ in range(STALE_AFTER + 1):
        costs.record(1, 10.0)
    assert costs.seconds(2) == pytest.approx(10.0 * 1.25)  # optimistic again: worth a retry


def test_copying_on_a_cpu_verifies_the_cheap_second_row_only():
    counts = plan_drafts([[1, 2, 3, 4]], [0.97], 1, 64, costs_of(CPU))
    assert counts == [1]
    # Rows nearly free: every draft.
    assert plan_drafts([[1, 2, 3, 4]], [0.97], 1, 64, costs_of(FLAT)) == [4]


def test_failing_lookups_verify_nothing_and_no_lookup_costs_nothing():
    assert plan_drafts([[1, 2, 3, 4]], [0.1], 1, 64, costs_of(CPU)) == [0]
    # Where rows are nearly free even a poor draft pays, but only the first one.
    assert plan_drafts([[1, 2, 3, 4]], [0.1], 1, 64, costs_of(FLAT)) == [1]
    assert plan_drafts([[], []], [0.9, 0.9], 2, 64, costs_of(FLAT)) == [0, 0]
    # Break-even is not enough: a plan with drafts must win by the margin.
    even = costs_of({1: 10.0, 2: 10.0 * 1.5})
    assert plan_drafts([[7]], [0.5], 1, 64, even) == [0]


def test_sampling_time_per_token_dilutes_what_drafts_save():
    # 2 rows cost 1.5 steps: a draft accepted 60% of the time pays (1.6 tokens for 1.5)...
    costs = costs_of({1: 10.0, 2: 15.0})
    assert plan_drafts([[7]], [0.6], 1, 64, costs) == [1]
    # ...but when every token also costs sampling time, which drafts do not save, the model
    # step is a smaller share of a token's time: 1.6 / (15 + 1.6 * 40) < 1 / (10 + 40).
    assert plan_drafts([[7]], [0.6], 1, 64, costs, seconds_per_token=40.0) == [0]


def test_better_sequences_get_the_rows_first_and_the_budget_caps_them():
    linear = costs_of({rows: 10.0 + 2.0 * (rows - 1) for rows in range(1, 7)})
    assert plan_drafts([[1, 2], [3, 4]], [0.2, 0.99], 2, 64, linear) == [0, 2]
    assert plan_drafts([[1, 2], [3, 4]], [0.99, 0.99], 2, 3, linear) == [1, 0]
    # Batched on the CPU: a step of 2 rows is already past the cheap second row.
    assert plan_drafts([[1, 2], [3, 4]], [0.99, 0.99], 2, 64, costs_of(CPU)) == [0, 0]

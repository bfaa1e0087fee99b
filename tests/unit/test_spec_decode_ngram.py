"""The n-gram proposer on fixed sequences, its incremental index against a brute-force search,
the room cap, and the greedy replay. Which drafts are worth verifying: test_spec_decode_planner."""

from __future__ import annotations

import random

import pytest

from inferd.spec_decode import NgramIndex, NgramProposer, SpeculativeConfig, draft_room
from inferd.spec_decode.simulate import replay_greedy


def lookup(tokens: list[int], k: int, min_n: int = 2, max_n: int = 4) -> list[int]:
    index = NgramIndex(min_n, max_n)
    index.sync(tokens)
    return index.lookup(tokens, k)


def brute_force(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The definition: longest n first, then the most recent earlier occurrence; the draft reads
    on through itself when the followers run out."""
    length = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if n >= length:
            continue
        suffix = tokens[length - n :]
        for end in range(length - 1, n - 1, -1):
            if tokens[end - n : end] == suffix:
                draft = []
                for j in range(k):
                    draft.append(tokens[end + j] if end + j < length else draft[j - (length - end)])
                return draft
    return []


def test_match_proposes_what_followed():
    assert lookup([1, 2, 3, 4, 5, 9, 2, 3], k=3) == [4, 5, 9]


def test_no_match_proposes_nothing():
    assert lookup([1, 2, 3, 4, 5, 6, 7, 8], k=3) == []
    # A single repeated token is below prompt_lookup_min = 2.
    assert lookup([5, 1, 2, 3, 4, 5], k=3) == []
    assert lookup([5, 1, 2, 3, 4, 5], k=3, min_n=1, max_n=4) == [1, 2, 3]
    assert lookup([], k=3) == [] and lookup([1], k=3) == []


def test_longest_n_wins_over_a_more_recent_shorter_match():
    tokens = [7, 2, 3, 10, 11, 12, 8, 2, 3, 20, 21, 22, 7, 2, 3]
    assert lookup(tokens, k=3, min_n=2, max_n=3) == [10, 11, 12]
    # With n capped at 2 only the bigram (2, 3) counts, and its latest occurrence wins.
    assert lookup(tokens, k=3, min_n=2, max_n=2) == [20, 21, 22]


def test_most_recent_occurrence_wins():
    assert lookup([1, 2, 5, 9, 1, 2, 6, 9, 1, 2], k=2) == [6, 9]


def test_k_caps_the_draft():
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
    assert lookup(tokens, k=4) == [3, 4, 5, 6]
    assert lookup(tokens, k=1) == [3]
    assert lookup(tokens, k=0) == []


def test_periodic_tail_reads_on_through_the_draft():
    assert lookup([9, 1, 2, 1, 2], k=5) == [1, 2, 1, 2, 1]
    assert lookup([4, 7, 7, 7], k=3, min_n=2, max_n=3) == [7, 7, 7]


def test_incremental_index_equals_the_brute_force_search():
    rng = random.Random(0)
    for min_n, max_n in [(2, 4), (1, 3), (3, 3)]:
        index = NgramIndex(min_n, max_n)
        tokens = [rng.randrange(6) for _ in range(30)]  # small vocabulary: many matches
        found = 0
        for step in range(300):
            # Tokens arrive 1..5 at a time, as accepted drafts do.
            tokens += [rng.randrange(6) for _ in range(1 + step % 5)]
            index.sync(tokens)
            got = index.lookup(tokens, 4)
            assert got == brute_force(tokens, 4, min_n, max_n)
            found += bool(got)
        assert found > 200  # the comparison covered real matches, not only misses


def test_index_survives_being_handed_a_shorter_sequence():
    index = NgramIndex(2, 3)
    long = [1, 2, 3, 1, 2, 3, 4, 1, 2]
    index.sync(long)
    short = [5, 6, 7, 5, 6]
    index.sync(short)
    assert index.lookup(short, 2) == [7, 5]


def test_draft_room_caps_at_max_tokens_and_max_model_len():
    # 10 outputs of 16 allowed: 6 more may be emitted, one of them the step's own token.
    assert draft_room(num_tokens=50, num_output_tokens=10, max_tokens=16, max_model_len=100) == 5
    # 3 positions left in the context.
    assert draft_room(num_tokens=97, num_output_tokens=10, max_tokens=100, max_model_len=100) == 2
    assert draft_room(num_tokens=99, num_output_tokens=10, max_tokens=100, max_model_len=100) == 0
    assert draft_room(num_tokens=50, num_output_tokens=16, max_tokens=16, max_model_len=100) == 0


def test_proposer_applies_k_and_room_and_forgets_sequences():
    config = SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_max=3, prompt_lookup_min=2)
    proposer = NgramProposer(config)
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    assert proposer.propose("a", tokens, room=10) == [3, 4, 5]
    assert proposer.propose("a", tokens, room=2) == [3, 4]
    assert proposer.propose("a", tokens, room=0) == []
    tokens += [3, 4]
    assert proposer.propose("a", tokens, room=10) == [5, 6, 1]
    assert proposer.propose("b", [8, 9, 8], room=10) == []
    assert len(proposer) == 2
    proposer.forget("a")
    proposer.forget("a")  # twice is harmless (finish after abort)
    assert len(proposer) == 1


def test_replaying_a_greedy_output_counts_steps_drafts_and_acceptance():
    config = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_max=3, prompt_lookup_min=2)
    prompt = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 99, 10, 11]
    output = [12, 13, 14, 15, 16, 17, 18, 19]
    r = replay_greedy(NgramProposer(config), prompt, output)
    # Step 1: draft 13..16 accepted, bonus 17. Step 2: room for one draft (18), bonus 19.
    assert r.decode_steps == 2 and r.tokens_per_step == pytest.approx(7 / 2)
    assert r.metrics.counters()["spec_decode_num_draft_tokens"] == 5
    assert r.metrics.acceptance_rate == 1.0
    # An output that leaves the text after two tokens: the rest decodes one token a step.
    off = replay_greedy(NgramProposer(config), prompt, [12, 13, 50, 51, 52, 53])
    assert off.metrics.num_accepted_tokens == 1  # 13 accepted, 14 rejected (50 emitted)
    assert off.decode_steps == 4 and off.output_tokens == 6


def test_proposing_twice_for_the_same_tokens_is_harmless():
    config = SpeculativeConfig(num_speculative_tokens=2, prompt_lookup_max=2, prompt_lookup_min=2)
    proposer = NgramProposer(config)
    tokens = [1, 2, 3, 4, 1, 2]
    assert proposer.propose(0, tokens, 5) == proposer.propose(0, tokens, 5) == [3, 4]
    assert proposer.propose(0, tokens + [3, 4], 5) == [1, 2]
    assert proposer.propose(0, tokens + [3, 4], 5) == [1, 2]

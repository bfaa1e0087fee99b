"""inferd's prefix routing without Ray: the block hashes are the engine's, a replica's table
matches leading blocks and forgets the least recently routed, and the routing choice prefers
the longest match unless its holder is too busy (milliseconds, no cluster)."""

from __future__ import annotations

import random

from inferd.block_hashes import block_hash, salted_root
from inferd.ray_serve.prefix_table import (
    NO_MATCH,
    OVERLOADED,
    PREFIX_HIT,
    ROOT,
    BlockTable,
    prompt_block_hashes,
    rank,
)


def _engine_chain(ids: list[int], block_size: int, salt: str | None) -> list[bytes]:
    parent, out = salted_root(ROOT, salt), []
    for start in range(0, len(ids) // block_size * block_size, block_size):
        parent = block_hash(parent, ids[start : start + block_size])
        out.append(parent)
    return out


def test_block_hashes_are_the_engines_chained_hashes():
    ids = list(range(1000, 1045))  # two full blocks of 16 and a partial one
    for salt in (None, "tenant-a"):
        ours = prompt_block_hashes(ids, 16, salt)
        assert ours == _engine_chain(ids, 16, salt)
        assert len(ours) == 2
    assert prompt_block_hashes(ids, 16, "tenant-a") != prompt_block_hashes(ids, 16, "tenant-b")
    assert prompt_block_hashes(ids[:15], 16) == []


def test_equal_prefixes_share_leading_hashes_only():
    a = prompt_block_hashes([1] * 32 + [2] * 16, 16)
    b = prompt_block_hashes([1] * 32 + [3] * 16, 16)
    assert a[:2] == b[:2] and a[2] != b[2]


def test_table_matches_leading_blocks_and_forgets_the_oldest():
    table = BlockTable(capacity=3)
    first = prompt_block_hashes(list(range(48)), 16)
    table.insert(first)
    assert table.match(first) == 3
    other = prompt_block_hashes([7] + list(range(1, 48)), 16)  # differs in block 0
    assert table.match(other) == 0
    assert table.match(first[:2] + other[2:]) == 2
    table.insert(other[:1])  # one more block: the least recently inserted goes
    assert len(table) == 3 and table.match(first) == 0 and table.match(other) == 1


def test_rank_sends_a_match_to_its_holder_while_it_is_not_too_busy():
    rng = random.Random(0)
    ranks, decision = rank({"a": 0, "b": 3, "c": 1}, {"a": 0, "b": 2, "c": 0}, 4, rng)
    assert decision == PREFIX_HIT and ranks == [["b"], ["c", "a"]]
    ranks, decision = rank({"a": 0, "b": 3}, {"a": 0, "b": 5}, 4, rng)
    assert decision == OVERLOADED and ranks == [["a"], ["b"]]


def test_rank_sends_prompts_nobody_holds_to_the_least_loaded():
    rng = random.Random(1)
    ranks, decision = rank({"a": 0, "b": 0, "c": 0}, {"a": 2, "b": 0, "c": 1}, 4, rng)
    assert decision == NO_MATCH and ranks == [["b"], ["c", "a"]]
    firsts = set()
    for _ in range(40):  # equally loaded: each comes first in turn, alone
        ranks, _ = rank({"a": 0, "b": 0, "c": 0}, {}, 4, rng)
        assert len(ranks[0]) == 1 and sorted(ranks[0] + ranks[1]) == ["a", "b", "c"]
        firsts.add(ranks[0][0])
    assert firsts == {"a", "b", "c"}
    assert rank({"a": 0}, {}, 4, rng) == ([["a"]], NO_MATCH)
    assert rank({}, {}, 4, rng) == ([], NO_MATCH)

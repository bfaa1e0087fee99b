"""Scheduler and KV-cache manager with fake model outputs: no model, milliseconds."""

from __future__ import annotations

import itertools

import pytest

from inferd.engine.kv_cache import NULL_BLOCK, KVCacheManager
from inferd.engine.request import Request, Sequence, SequenceStatus, update_block_hashes
from inferd.engine.scheduler import Scheduler
from inferd.outputs import RequestMetrics
from inferd.sampling_params import SamplingParams

BS = 4
ROOT = b"test-root"
_ids = itertools.count()


def make_seq(prompt: list[int], max_tokens: int = 4) -> Sequence:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    req = Request(f"r{next(_ids)}", None, list(prompt), params, RequestMetrics(0.0), max_tokens)
    seq = Sequence(next(_ids), req, 0, list(prompt), len(prompt))
    req.sequences.append(seq)
    update_block_hashes(seq, BS, ROOT)
    return seq


def make(num_blocks=64, windows=(None,), budget=32, max_seqs=8, caching=True):
    kv = KVCacheManager(list(windows), [num_blocks] * len(windows), BS, caching)
    return kv, Scheduler(kv, max_seqs, budget)


def run_step(sched: Scheduler, kv: KVCacheManager, finished: list[Sequence]):
    """What the engine does after a step, with a fake sampled token (always 7)."""
    out = sched.schedule()
    for s in out.scheduled:
        seq = s.seq
        seq.num_computed += s.num_new_tokens
        if s.needs_logits:
            seq.token_ids.append(7)
            update_block_hashes(seq, BS, ROOT)
        kv.cache_computed_blocks(seq)
        if seq.num_output_tokens >= seq.request.max_tokens:
            sched.remove(seq)
            seq.status = SequenceStatus.FINISHED
            finished.append(seq)
    return out


def free_blocks(kv: KVCacheManager) -> list[int]:
    return [p.num_free for p in kv.pools]


def test_budget_is_respected_and_long_prompt_is_chunked():
    kv, sched = make(budget=32)
    long = make_seq(list(range(100)))
    sched.add(long)
    chunks = []
    finished = []
    while long.num_output_tokens == 0:
        out = run_step(sched, kv, finished)
        assert out.num_tokens <= 32
        chunks.append(out.num_tokens)
    assert chunks == [32, 32, 32, 4]


def test_decodes_are_scheduled_before_new_prefills():
    kv, sched = make(budget=8)
    a, b = make_seq([1, 2, 3], max_tokens=10), make_seq([4, 5, 6], max_tokens=10)
    sched.add(a)
    sched.add(b)
    run_step(sched, kv, [])  # both prefill (6 tokens)
    newcomer = make_seq(list(range(50, 70)))
    sched.add(newcomer)
    out = sched.schedule()
    first_two = [s.seq for s in out.scheduled[:2]]
    assert first_two == [a, b] and all(s.num_new_tokens == 1 for s in out.scheduled[:2])
    assert out.scheduled[2].seq is newcomer and out.scheduled[2].num_new_tokens == 6
    assert out.num_tokens == 8


def test_budget_never_exceeded_under_many_requests():
    kv, sched = make(budget=16, max_seqs=4)
    seqs = [make_seq(list(range(i, i + 9)), max_tokens=5) for i in range(10)]
    for s in seqs:
        sched.add(s)
    finished: list[Sequence] = []
    for _ in range(500):
        if not sched.has_work():
            break
        out = run_step(sched, kv, finished)
        assert out.num_tokens <= 16
        assert len(sched.running) <= 4
    assert len(finished) == 10


def test_preemption_under_tiny_pool_finishes_every_request():
    # 13 usable blocks of 4 tokens; each request needs up to 4 blocks (12 prompt + 4 output).
    kv, sched = make(num_blocks=14, budget=64, max_seqs=8)
    start = free_blocks(kv)
    seqs = [make_seq([100 + i] * 12, max_tokens=4) for i in range(6)]
    for s in seqs:
        sched.add(s)
    finished: list[Sequence] = []
    for _ in range(1000):
        if not sched.has_work():
            break
        run_step(sched, kv, finished)
    assert sorted(s.seq_id for s in finished) == sorted(s.seq_id for s in seqs)
    assert sched.counters.num_preemptions > 0
    assert all(s.num_output_tokens == 4 for s in seqs)
    assert free_blocks(kv) == start


def test_newest_running_sequence_is_the_one_preempted():
    kv, sched = make(num_blocks=7, budget=64, max_seqs=8)  # 6 usable blocks
    old, new = make_seq([1] * 12, max_tokens=8), make_seq([2] * 12, max_tokens=8)
    sched.add(old)
    sched.add(new)
    run_step(sched, kv, [])  # 3 blocks each: pool full
    out = run_step(sched, kv, [])  # `old` needs a 4th block for token 12
    assert out.preempted == [new]
    assert new.status is SequenceStatus.WAITING and new.num_computed == 0
    assert sched.waiting[0] is new and old in sched.running


def test_shared_prefix_blocks_return_to_zero_references():
    kv, sched = make(num_blocks=32)
    prefix = list(range(40, 52))  # 3 full blocks
    a = make_seq(prefix + [1, 2], max_tokens=5)
    sched.add(a)
    finished: list[Sequence] = []
    run_step(sched, kv, finished)
    b = make_seq(prefix + [9, 9, 9], max_tokens=2)
    sched.add(b)
    out = run_step(sched, kv, finished)
    step_b = next(s for s in out.scheduled if s.seq is b)
    assert step_b.num_new_tokens == 3  # 12 of 15 prompt tokens came from the cache
    shared = a.block_tables[0][:3]
    assert b.block_tables[0][:3] == shared
    assert all(kv.pools[0].ref[blk] == 2 for blk in shared)
    assert sched.counters.prefix_cache_hits == 12
    while sched.has_work():
        run_step(sched, kv, finished)
    assert all(kv.pools[0].ref[blk] == 0 for blk in shared)
    assert all(kv.pools[0].ref[blk] == 0 for blk in range(1, 32))


def test_aborts_return_every_block():
    kv, sched = make(num_blocks=40)
    start = free_blocks(kv)
    seqs = [make_seq(list(range(i, i + 10)), max_tokens=20) for i in range(5)]
    for s in seqs:
        sched.add(s)
    for _ in range(3):
        run_step(sched, kv, [])
    for s in seqs:
        sched.remove(s)
    assert not sched.has_work()
    assert free_blocks(kv) == start


def test_cached_free_blocks_survive_until_uncached_ones_are_used():
    kv, sched = make(num_blocks=9)  # 8 usable blocks
    a = make_seq(list(range(8)) + [99], max_tokens=1)  # 2 full blocks + 1 partial
    sched.add(a)
    finished: list[Sequence] = []
    while sched.has_work():
        run_step(sched, kv, finished)
    pool = kv.pools[0]
    kept = dict(pool.cached)
    assert len(kept) == 2 and pool.num_free == 8
    b = make_seq(list(range(200, 221)), max_tokens=1)  # 21 tokens: the 6 uncached blocks
    sched.add(b)
    run_step(sched, kv, finished)
    assert all(pool.cached.get(h) == blk for h, blk in kept.items())
    newer = {h: blk for h, blk in pool.cached.items() if h not in kept}  # b's, freed later
    # 3 blocks: b's uncached partial block, then the two least recently freed cached ones.
    c = make_seq(list(range(300, 310)), max_tokens=1)
    sched.add(c)
    run_step(sched, kv, finished)
    assert not any(pool.cached.get(h) == blk for h, blk in kept.items())
    assert all(pool.cached.get(h) == blk for h, blk in newer.items())


def test_sliding_group_drops_blocks_outside_the_window():
    window = 8
    kv, sched = make(num_blocks=64, windows=(None, window), budget=8)
    seq = make_seq(list(range(40)), max_tokens=3)
    sched.add(seq)
    finished: list[Sequence] = []
    while sched.has_work():
        run_step(sched, kv, finished)
        if seq.block_tables:
            live = [b for b in seq.block_tables[1] if b != NULL_BLOCK]
            # window (8) behind the step's first token + the step's 8 tokens, whole blocks
            assert len(live) <= (window - 1 + 8) // BS + 2
            assert len([b for b in seq.block_tables[0] if b != NULL_BLOCK]) == len(
                seq.block_tables[0]
            )
    assert seq in finished


def test_prefix_hit_with_sliding_group_needs_only_the_window():
    window = 8
    kv, sched = make(num_blocks=64, windows=(None, window), budget=64)
    prompt = list(range(30))
    a = make_seq(prompt + [1], max_tokens=1)
    sched.add(a)
    finished: list[Sequence] = []
    run_step(sched, kv, finished)
    b = make_seq(prompt + [2, 3], max_tokens=1)
    cached, tables = kv.find_cached_prefix(b)
    assert cached == 28  # 7 full blocks of the shared 30 tokens
    first_needed = (28 - window + 1) // BS
    assert tables[1][:first_needed] == [NULL_BLOCK] * first_needed
    assert NULL_BLOCK not in tables[0]


@pytest.mark.parametrize("partial", [True, False])
def test_fork_shares_full_blocks_and_copies_the_partial_one(partial):
    kv, sched = make(num_blocks=32)
    prompt = list(range(10 if partial else 12))
    parent = make_seq(prompt, max_tokens=4)
    sched.add(parent)
    sched.schedule()
    parent.num_computed = len(prompt)
    child = make_seq(prompt, max_tokens=4)
    copies = sched.fork(parent, child)
    full = len(prompt) // BS
    assert child.block_tables[0][:full] == parent.block_tables[0][:full]
    if partial:
        assert len(copies) == 1 and copies[0][1] == parent.block_tables[0][-1]
        assert child.block_tables[0][-1] == copies[0][2] != parent.block_tables[0][-1]
    else:
        assert copies == []
    assert child in sched.running and child.num_computed == len(prompt)

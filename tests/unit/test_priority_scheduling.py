"""The waiting queue's policies and the queue deadline, driven as tests/unit/test_scheduler.py
drives the scheduler (fabricated runner outputs, every record checked against a device side):
under `priority` the queue is ordered by (priority, arrival) and a waiting request preempts only
a running one of a strictly lower priority; fcfs is unchanged; `max_queue_time` ends requests
that were never scheduled, and nothing else."""

from __future__ import annotations

import time

from test_scheduler import (
    BS,
    EOS,
    ROOT,
    CheckedScheduler,
    fake_output,
    free_blocks,
    make_request,
    run_all,
    run_step,
)

from inferd.engine.scheduling.kv_cache import KVCacheManager
from inferd.engine.scheduling.request import SequenceStatus


def make(num_blocks=64, max_seqs=8, policy="priority", max_queue_time=None):
    kv = KVCacheManager([None], [num_blocks], BS, True)
    sched = CheckedScheduler(kv, max_seqs, 64, 256, (EOS,), ROOT, policy=policy,
                             max_queue_time=max_queue_time)  # fmt: skip
    return kv, sched


def add(sched, prompt, priority=0, arrival=None, max_tokens=4):
    req = make_request(prompt, max_tokens=max_tokens)
    req.priority = priority
    req.metrics.arrival_time = time.monotonic() if arrival is None else arrival
    sched.add_request(req)
    return req.sequences[0]


def test_priority_orders_the_waiting_queue_ties_by_arrival():
    kv, sched = make(max_seqs=1)
    a, b, c, d = (add(sched, [10 + i] * 3, priority=p) for i, p in enumerate([2, 0, 2, 1]))
    assert list(sched.waiting) == [b, d, a, c]
    started = []
    for _ in range(100):
        if not sched.has_unfinished_requests():
            break
        out, _ = run_step(sched)
        started += [sched.seq(r) for r in out.rows if r.num_computed == 0]
    assert started == [b, d, a, c]


def test_fcfs_keeps_arrival_order_whatever_the_priority():
    kv, sched = make(max_seqs=1, policy="fcfs")
    seqs = [add(sched, [10 + i] * 3, priority=p) for i, p in enumerate([2, 0, 1])]
    assert list(sched.waiting) == seqs
    run_step(sched)
    late = add(sched, [9] * 3, priority=-5)  # would preempt under `priority`
    out, _ = run_step(sched)
    assert out.preempted_seq_ids == [] and sched.running == [seqs[0]]
    assert run_all(sched) == [s.request.request_id for s in [*seqs, late]]


def test_a_waiting_request_preempts_the_lowest_priority_newest_among_equals():
    # 9 usable blocks: three prompts of 10 tokens hold 3 each (room for their decodes).
    kv, sched = make(num_blocks=10)
    start = free_blocks(kv)
    mid, low_old, low_new = (add(sched, [20 + i] * 10, priority=p, max_tokens=2)
                             for i, p in enumerate([3, 5, 5]))  # fmt: skip
    run_step(sched)
    high = add(sched, [30] * 4, priority=0, max_tokens=2)
    out = sched.schedule()
    assert out.preempted_seq_ids == [low_new.seq_id]
    assert low_new.status is SequenceStatus.WAITING and low_new.num_computed == 0
    assert [sched.seq(r) for r in out.rows] == [mid, low_old, high]  # its decode was withdrawn
    news = sched.update_from_output(out, fake_output(out))
    finished = [o.request_id for o in news if o.finished] + run_all(sched)
    assert set(finished) == {s.request.request_id for s in (mid, low_old, low_new, high)}
    assert all(s.num_output_tokens == 2 for s in (mid, low_old, low_new, high))
    assert free_blocks(kv) == start


def test_never_preempts_an_equal_or_higher_priority():
    kv, sched = make(num_blocks=10)
    running = [add(sched, [20 + i] * 10, priority=p, max_tokens=3)
               for i, p in enumerate([1, 0, 1])]  # fmt: skip
    run_step(sched)
    peer = add(sched, [30] * 4, priority=1, max_tokens=2)
    out, _ = run_step(sched)
    assert out.preempted_seq_ids == [] and peer.status is SequenceStatus.WAITING
    assert all(s.status is SequenceStatus.RUNNING for s in running)
    assert sched.counters.num_preemptions == 0


def test_a_full_batch_makes_a_seat_for_a_higher_priority():
    kv, sched = make(max_seqs=2)
    low = [add(sched, [20 + i] * 3, priority=4, max_tokens=8) for i in range(2)]
    run_step(sched)
    high = add(sched, [30] * 3, priority=0, max_tokens=2)
    out, _ = run_step(sched)
    assert out.preempted_seq_ids == [low[1].seq_id] and high in sched.running


def test_running_victim_under_priority_is_the_lowest_priority():
    # 6 usable blocks; both hold 3 and both need a 4th: fcfs would preempt the newest (`high`).
    kv, sched = make(num_blocks=7)
    low = add(sched, [1] * 12, priority=5, max_tokens=8)
    high = add(sched, [2] * 12, priority=0, max_tokens=8)
    run_step(sched)
    out, _ = run_step(sched)
    assert out.preempted_seq_ids == [low.seq_id] and high in sched.running


def test_queue_deadline_drops_only_requests_never_scheduled():
    kv, sched = make(max_seqs=1, policy="fcfs", max_queue_time=5.0)
    start = free_blocks(kv)
    long_ago = time.monotonic() - 60
    running = add(sched, [5] * 3, arrival=long_ago, max_tokens=50)
    sched.max_queue_time = None  # admitted before any limit applied: runs past it
    run_step(sched)
    sched.max_queue_time = 5.0
    stale = add(sched, [6] * 9, arrival=long_ago)
    fresh = add(sched, [7] * 3)
    out, _ = run_step(sched)
    (dropped,) = sched.take_failed()
    assert dropped.request_id == stale.request.request_id and dropped.finished
    assert [d.finish_reason for d in dropped.samples] == ["queue_timeout"]
    assert "--max-queue-time" in dropped.error
    assert stale.request.request_id not in sched.requests and stale not in sched.waiting
    assert [sched.seq(r) for r in out.rows] == [running] and fresh in sched.waiting
    assert sched.stats().num_queue_timeouts == 1
    run_all(sched)
    assert running.num_output_tokens == 50 and fresh.num_output_tokens == 4
    assert free_blocks(kv) == start


def test_a_preempted_request_is_never_cut_by_the_deadline():
    kv, sched = make(num_blocks=7, policy="fcfs", max_queue_time=5.0)
    now = time.monotonic()
    add(sched, [1] * 12, arrival=now, max_tokens=8)
    new = add(sched, [2] * 12, arrival=now)
    run_step(sched)
    run_step(sched)  # `new` is preempted back to the queue
    assert new.status is SequenceStatus.WAITING
    new.request.metrics.arrival_time = now - 60  # long past the deadline now
    run_all(sched)
    assert sched.counters.queue_timeouts == 0 and new.num_output_tokens == 4

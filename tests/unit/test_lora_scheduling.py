"""LoRA in the core without a model: adapter slots (LRU, held while a request is unfinished),
a request waiting for a slot without holding up others, each row's slot in the step record,
and prefix-cache hashes that differ per adapter."""

from __future__ import annotations

from test_scheduler import BS, EOS, ROOT, CheckedScheduler, make_request, run_all, run_step

from inferd.engine.scheduling.adapter_slots import AdapterSlots
from inferd.engine.scheduling.kv_cache import KVCacheManager
from inferd.engine.scheduling.request import update_block_hashes
from inferd.lora_request import LoRARequest

A, B, C = (LoRARequest(n, i, f"/adapters/{n}") for i, n in enumerate("abc", start=1))


def scheduler(max_loras: int) -> CheckedScheduler:
    kv = KVCacheManager([None], [64], BS, True)
    return CheckedScheduler(kv, 8, 64, 256, (EOS,), ROOT, adapters=AdapterSlots(max_loras))


def add(sched, lora, prompt=(5, 6, 7), max_tokens=3):
    req = make_request(list(prompt), max_tokens)
    req.lora = lora
    sched.add_request(req)
    return req


def test_slots_are_reused_and_evicted_least_recently_used():
    slots = AdapterSlots(2)
    assert slots.acquire(A) == 1 and slots.acquire(B) == 2
    assert slots.acquire(A) == 1  # resident: no load
    assert slots.take_loads() == [(1, A), (2, B)]
    assert slots.acquire(C) is None  # both in use
    slots.release(2)  # B has no users now; A still has two
    assert slots.acquire(C) == 2  # C takes B's slot
    assert slots.take_loads() == [(2, C)]
    slots.release(1)
    slots.release(1)
    slots.release(2)
    assert slots.acquire(B) == 1  # A was the least recently used of the unused
    assert slots.resident() == ["c", "b"]
    assert slots.requests_served == {"a": 2, "b": 2, "c": 1}


def test_a_request_waiting_for_a_slot_holds_up_no_one():
    sched = scheduler(max_loras=1)
    first, waiting = add(sched, A), add(sched, B)
    base, same = add(sched, None), add(sched, A)
    record, _ = run_step(sched)
    slots = {sched.seq(r).request.request_id: r.adapter_slot for r in record.rows}
    assert slots == {first.request_id: 1, base.request_id: 0, same.request_id: 1}
    assert record.adapter_loads == [(1, A)]
    assert run_all(sched)[-1] == waiting.request_id  # it ran once A's requests finished
    assert sched.adapters.resident() == ["b"]


def test_the_slot_is_released_when_the_request_finishes_or_aborts():
    sched = scheduler(max_loras=1)
    req = add(sched, A, max_tokens=50)
    run_step(sched)
    assert sched.adapters.slots[1][1] == 1
    sched.abort_request(req.request_id)
    assert sched.adapters.slots[1][1] == 0 and req.adapter_slot == 0


def test_block_hashes_differ_per_adapter_and_per_salt():
    def hashes(lora, salt=None):
        req = make_request(list(range(3 * BS)))
        req.lora, req.cache_salt = lora, salt
        seq = req.sequences[0]
        update_block_hashes(seq, BS, ROOT)
        return seq.block_hashes

    base, a, b = hashes(None), hashes(A), hashes(B)
    assert len({base[0], a[0], b[0]}) == 3
    assert hashes(A) == a  # the same adapter shares its blocks
    assert hashes(LoRARequest("a", 1, "/other/path"))[0] != a[0]
    assert hashes(A, "tenant")[0] not in (a[0], hashes(None, "tenant")[0])

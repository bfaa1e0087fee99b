"""The KV tiers without a model (milliseconds): the block file's checks, a tier's folder (bound,
LRU, damage, a full disk, a read-only folder, a killed writer's leftovers), and the scheduler
taking blocks from a tier as prefix-cache hits (engine/kv_tiers/)."""

from __future__ import annotations

import errno
import os
import time

import pytest
import torch

from inferd.engine.kv_tiers.block_entry import (
    HEADER_BYTES,
    EntryRefused,
    check_entry,
    encode_header,
)
from inferd.engine.kv_tiers.block_store import BlockStore
from inferd.engine.kv_tiers.connector import KVConnector
from inferd.engine.scheduling.kv_cache import NULL_BLOCK
from inferd.kv_tier_stats import TierStats, merge_tiers
from tests.unit.test_scheduler import BS, add, fake_output, make

IDENTITY = b"i" * 32
PAYLOAD = 64


def entry(h: bytes, fill: int = 1, identity: bytes = IDENTITY) -> bytes:
    payload = memoryview(bytes([fill]) * PAYLOAD)
    return encode_header(identity, h, payload) + payload.tobytes()


def h(i: int) -> bytes:
    return bytes([i]) * 32


# ---- the block file ---------------------------------------------------------------------------
def test_entry_round_trip_and_every_refusal():
    data = entry(h(1), fill=7)
    assert check_entry(data, IDENTITY, h(1), PAYLOAD).tobytes() == bytes([7]) * PAYLOAD
    flipped = bytearray(data)
    flipped[-1] ^= 1
    cases = {
        "checksum": (bytes(flipped), IDENTITY, h(1)),
        "another model": (data, b"j" * 32, h(1)),
        "another block": (data, IDENTITY, h(2)),
        "payload bytes": (data[:-1], IDENTITY, h(1)),
        "shorter than a header": (data[: HEADER_BYTES - 1], IDENTITY, h(1)),
        "not a KV block file": (b"X" + data[1:], IDENTITY, h(1)),
    }
    for why, (blob, identity, name) in cases.items():
        with pytest.raises(EntryRefused, match=why):
            check_entry(blob, identity, name, PAYLOAD)


# ---- a tier's folder --------------------------------------------------------------------------
def store(root, capacity=10 * (HEADER_BYTES + PAYLOAD), identity=IDENTITY) -> BlockStore:
    return BlockStore("disk", root, identity, capacity, PAYLOAD)


def payload(fill: int) -> memoryview:
    return memoryview(bytes([fill]) * PAYLOAD)


def test_write_read_private_files_and_other_models_ignored(tmp_path):
    s = store(tmp_path)
    assert s.write(h(1), payload(3))
    assert s.read(h(1)).tobytes() == bytes([3]) * PAYLOAD
    path = s.path_of(h(1))
    assert path.stat().st_mode & 0o777 == 0o600 and s.folder.stat().st_mode & 0o777 == 0o700
    other = store(tmp_path, identity=b"o" * 32)  # another model: its own folder, nothing found
    assert other.read(h(1)) is None and other.snapshot().misses == 1
    # A file of the first model put where the other looks: refused, deleted, never served.
    other.path_of(h(1)).parent.mkdir(parents=True, exist_ok=True)
    other.path_of(h(1)).write_bytes(path.read_bytes())
    assert other.read(h(1)) is None and other.snapshot().damaged == 1
    assert not other.path_of(h(1)).exists()
    stats = s.snapshot()
    assert (stats.hits, stats.bytes_written, stats.bytes_read) == (
        1,
        HEADER_BYTES + PAYLOAD,
        HEADER_BYTES + PAYLOAD,
    )


def test_bound_evicts_least_recently_used(tmp_path):
    one = HEADER_BYTES + PAYLOAD
    s = store(tmp_path, capacity=4 * one)
    for i in range(4):
        s.write(h(i), payload(i))
        os.utime(s.path_of(h(i)), (1000 + i, 1000 + i))  # an old, distinct LRU clock
    assert s.read(h(0)) is not None  # now the most recently used
    s.write(h(9), payload(9))  # over the bound: down to 90% of it, oldest first
    kept = {i for i in (0, 1, 2, 3, 9) if s.contains(h(i))}
    assert kept == {0, 3, 9} and s.snapshot().stored_bytes == 3 * one


def test_damaged_entry_is_deleted_and_counted(tmp_path):
    s = store(tmp_path)
    s.write(h(1), payload(1))
    path = s.path_of(h(1))
    data = bytearray(path.read_bytes())
    data[HEADER_BYTES + 5] ^= 0xFF
    path.write_bytes(bytes(data))
    assert s.read(h(1)) is None
    assert not path.exists() and s.snapshot().damaged == 1


def test_full_disk_counts_an_error_and_leaves_nothing(tmp_path, monkeypatch):
    s = store(tmp_path)

    def full(*args, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    assert not s.write(h(1), payload(1))
    assert s.snapshot().write_errors == 1
    assert not s.contains(h(1)) and not list(tmp_path.rglob("*.part"))


def test_short_writes_of_a_nearly_full_disk_never_publish_a_cut_file(tmp_path, monkeypatch):
    s = store(tmp_path)
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data)[:7]))
    assert s.write(h(1), payload(5))  # every byte, seven at a time
    assert s.read(h(1)).tobytes() == bytes([5]) * PAYLOAD
    monkeypatch.setattr(os, "write", lambda fd, data: 0)  # the disk took nothing
    assert not s.write(h(2), payload(6))
    assert not s.contains(h(2)) and s.snapshot().write_errors == 1
    assert not list(tmp_path.rglob("*.part"))


def test_read_only_folder_serves_what_it_has(tmp_path, monkeypatch):
    store(tmp_path).write(h(1), payload(4))
    real_write_bytes = type(tmp_path).write_bytes

    def refuse(self, data):
        if self.name.startswith(".probe"):
            raise OSError(errno.EROFS, "Read-only file system")
        return real_write_bytes(self, data)

    monkeypatch.setattr(type(tmp_path), "write_bytes", refuse)
    s = store(tmp_path)
    assert not s.writable
    assert s.read(h(1)).tobytes() == bytes([4]) * PAYLOAD
    assert not s.write(h(2), payload(2)) and not s.contains(h(2))


def test_killed_writers_leftovers_are_removed(tmp_path):
    s = store(tmp_path)
    s.write(h(1), payload(1))
    stale = s.path_of(h(1)).with_name("x.kv.123.1.part")
    stale.write_bytes(b"half a block")
    os.utime(stale, (time.time() - 3600,) * 2)
    fresh = s.path_of(h(1)).with_name("y.kv.124.1.part")
    fresh.write_bytes(b"being written")
    store(tmp_path)  # a start measures the folder
    assert not stale.exists() and fresh.exists() and s.contains(h(1))


def test_too_small_bound_and_not_a_folder_are_refused(tmp_path):
    with pytest.raises(ValueError, match="hold no block"):
        store(tmp_path, capacity=HEADER_BYTES)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="not a folder"):
        store(tmp_path / "file")


def test_replicas_stats_add_up_but_the_folder_is_one():
    a = (TierStats("memory", hits=1, stored_bytes=10, capacity_bytes=99), TierStats("disk", 2))
    b = (TierStats("memory", hits=3, stored_bytes=12, capacity_bytes=99),)
    merged = merge_tiers([a, b])
    assert merged[0] == TierStats("memory", hits=4, stored_bytes=12, capacity_bytes=99)
    assert merged[1] == TierStats("disk", 2)


# ---- the scheduler taking blocks from a tier ---------------------------------------------------
def schedule_when_ready(sched, timeout=5.0):
    deadline = time.monotonic() + timeout
    while True:
        record = sched.schedule()
        if record.rows or time.monotonic() > deadline:
            return record
        time.sleep(0.001)


def compute_and_keep(sched, connector, prompt):
    """Run a prompt to its end; keep every block it names (fake bytes: the block's hash)."""
    add(sched, prompt, max_tokens=1)
    while sched.has_unfinished_requests():
        record = schedule_when_ready(sched)
        sched.update_from_output(record, fake_output(record))
        saves = sched.take_saves()
        rows = [torch.frombuffer(bytearray(name * 2), dtype=torch.uint8) for name, _ in saves]
        connector.save([name for name, _ in saves], rows)
    connector.flush()


@pytest.mark.parametrize("windows", [(None,), (None, 2 * BS)])
def test_blocks_from_a_tier_are_loaded_as_cached_tokens(tmp_path, windows):
    connector = KVConnector([BlockStore("disk", tmp_path, IDENTITY, 1 << 20, 64)])
    prompt = list(range(100, 100 + 5 * BS + 1))
    _, first = make(windows=windows, budget=64)
    first.connector = connector
    compute_and_keep(first, connector, prompt)
    # A fresh pool (a restart, or another replica) with the same tier: 5 blocks come back.
    kv, again = make(windows=windows, budget=64)
    again.connector = connector
    seq = add(again, prompt, max_tokens=1)
    record = schedule_when_ready(again)
    assert record.rows[0].num_computed == 5 * BS and record.rows[0].num_new_tokens == 1
    (load,) = record.kv_loads
    assert [bytes(row[:32].tolist()) for row in load.rows] == seq.block_hashes[:5]
    assert load.blocks[0] == seq.block_tables[0][:5]
    if len(windows) == 2:  # the sliding group takes only what its window sees
        needed = (5 * BS - 2 * BS + 1) // BS
        assert load.blocks[1][:needed] == [NULL_BLOCK] * needed
        assert NULL_BLOCK not in load.blocks[1][needed:]
    assert again.counters.prefix_cache_hits == 5 * BS
    for pool, blocks in zip(kv.pools, load.blocks):  # held by the sequence alone
        assert all(pool.ref[b] == 1 for b in blocks if b != NULL_BLOCK)
    # Blocks loaded are named in the pool: another prompt finds them there.
    assert kv.find_cached_prefix(add(again, prompt, max_tokens=1))[0] == 5 * BS


def test_no_room_for_loaded_blocks_gives_them_back(tmp_path):
    connector = KVConnector([BlockStore("disk", tmp_path, IDENTITY, 1 << 20, 64)])
    prompt = list(range(100, 100 + 5 * BS + 1))
    _, first = make(budget=64)
    first.connector = connector
    compute_and_keep(first, connector, prompt)
    kv, again = make(num_blocks=8, budget=64)  # 7 usable blocks
    again.connector = connector
    add(again, list(range(900, 900 + 2 * BS - 2)), max_tokens=8)  # holds 2 of them
    record = schedule_when_ready(again)  # (once its own lookup found nothing)
    again.update_from_output(record, fake_output(record))
    seq = add(again, prompt, max_tokens=1)
    again._look_ahead()  # what the next schedule() would start
    deadline = time.monotonic() + 5
    while not connector.lookups[seq.seq_id].done and time.monotonic() < deadline:
        time.sleep(0.001)
    free_before = kv.pools[0].num_free
    # The 5 loaded blocks fit the 5 free ones, the prompt's last token does not: all given back.
    record = again.schedule()
    assert not record.kv_loads and [r.seq_id for r in record.rows] != [seq.seq_id]
    assert kv.pools[0].num_free == free_before == 5
    assert not kv.pools[0].cached.keys() & set(seq.block_hashes)

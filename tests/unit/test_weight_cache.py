"""Cache entries under weights/: each a .safetensors with a .json that says what it is; the
least recently used go while the entries exceed the cache's size in bytes, files of earlier
versions (no .json: the dense, sometimes float32, copies inferd used to write) are removed, and
an entry is written a tensor at a time."""

from __future__ import annotations

import json
import os

import pytest
import torch

from inferd.loader import weight_cache


def test_entries_say_what_they_hold_and_the_least_used_go(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERD_CACHE", str(tmp_path))
    legacy = tmp_path / "weights" / "0123.safetensors"
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(b"an old float32 copy")
    source = tmp_path / "model.gguf"
    source.write_bytes(b"gguf")
    paths, size = [], 1 << 20
    for i in range(6):
        path = weight_cache.entry_path(source, f"mode-{i}", 0, 1)
        ok = weight_cache.write_entry(path, {"t": torch.arange(4.0)}, {"k": "v"},
                                      {"model": str(source), "mode": f"mode-{i}"},
                                      cache_bytes=4 * size)  # fmt: skip
        assert ok
        os.utime(path, (i, 1_000_000 + i))  # written (or last used) in this order
        paths.append(path)
        size = path.stat().st_size  # every entry's size: the same tensors and header
    entries = weight_cache.entries()
    assert [e.path for e in entries] == paths[-4:]  # four entries' worth of bytes
    assert not legacy.exists()
    info = json.loads(paths[-1].with_suffix(".json").read_text())
    assert info["mode"] == "mode-5" and info["model"] == str(source)
    assert info["bytes"] == paths[-1].stat().st_size == entries[-1].bytes
    os.utime(entries[0].path, (10, 2_000_000))  # used again: the newest
    weight_cache.evict_old(tmp_path / "weights", 3 * entries[0].bytes)
    assert [e.path for e in weight_cache.entries()] == [paths[4], paths[5], paths[2]]
    weight_cache.remove(entries[0])
    assert not entries[0].path.exists() and not entries[0].path.with_suffix(".json").exists()
    mapped, header, base = weight_cache.map_entry(paths[-1])
    assert header["__metadata__"] == {"k": "v"} and base > 8
    assert torch.equal(torch.frombuffer(mapped, dtype=torch.float32, count=4, offset=base),
                       torch.arange(4.0))  # fmt: skip


def test_an_entry_larger_than_the_cache_or_the_disk_is_not_written(tmp_path):
    where = tmp_path / "weights"
    why = weight_cache.room_for(3 << 30, where, 2 << 30)
    assert "exceed the weight cache's size of 2.00 GiB" in why
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    why = weight_cache.room_for(free + (1 << 30), where, free + (2 << 30))
    assert why is not None and "free" in why
    assert weight_cache.room_for(1 << 20, where, 2 << 30) is None


def test_the_budget_comes_from_the_flag_then_the_environment(monkeypatch):
    monkeypatch.delenv("INFERD_WEIGHT_CACHE_SIZE", raising=False)
    assert weight_cache.budget() == weight_cache.DEFAULT_BUDGET
    monkeypatch.setenv("INFERD_WEIGHT_CACHE_SIZE", "5GiB")
    assert weight_cache.budget() == 5 << 30 and weight_cache.budget(7) == 7
    monkeypatch.setenv("INFERD_WEIGHT_CACHE_SIZE", "lots")
    with pytest.raises(ValueError, match="INFERD_WEIGHT_CACHE_SIZE: cannot parse 'lots'"):
        weight_cache.budget()


def test_an_entry_written_a_tensor_at_a_time_reads_back(tmp_path):
    path = tmp_path / "weights" / "e.safetensors"
    writer = weight_cache.EntryWriter(path, 1024)
    tensors = {"a": torch.arange(10, dtype=torch.uint8), "b": torch.randn(3, 5),
               "c": torch.randn(7).half()}  # fmt: skip
    for key, t in tensors.items():
        writer.write(key, t)
    writer.commit({"layout": "[]"}, {"model": "m"}, 1 << 30)
    from safetensors.torch import load_file

    loaded = load_file(str(path))  # the safetensors library reads it as its own
    assert all(torch.equal(loaded[k], t) for k, t in tensors.items())
    mapped, header, base = weight_cache.map_entry(path)
    assert header["__metadata__"] == {"layout": "[]"}


def test_what_a_failed_writer_wrote_maps_back(tmp_path):
    writer = weight_cache.EntryWriter(tmp_path / "weights" / "e.safetensors", 512)
    writer.write("a", torch.arange(6.0))
    mapped, header, base = weight_cache.map_unfinished(writer, {"layout": "[]"})
    writer.abort()  # the file is gone; the mapping still reads it
    assert not writer.tmp.exists()
    start, end = header["a"]["data_offsets"]
    got = torch.frombuffer(mapped, dtype=torch.float32, count=6, offset=base + start)
    assert torch.equal(got, torch.arange(6.0))


def test_one_entry_per_model_and_mode(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERD_CACHE", str(tmp_path))
    source = tmp_path / "model.gguf"
    source.write_bytes(b"gguf")
    info = {"model": str(source), "mode": "blocks", "rank": 0, "world": 1}
    first = weight_cache.entry_path(source, "blocks", 0, 1)
    weight_cache.write_entry(first, {"t": torch.zeros(2)}, {}, info)
    source.write_bytes(b"gguf, edited")  # a new file at the same path: a new key
    second = weight_cache.entry_path(source, "blocks", 0, 1)
    assert second != first
    weight_cache.write_entry(second, {"t": torch.ones(2)}, {}, info)
    assert [e.path for e in weight_cache.entries()] == [second]


def test_a_check_started_early_is_used_once_or_dropped(tmp_path, monkeypatch):
    # engine/execution/setup.py starts verifying a GGUF file's entry before it knows whether the
    # model keeps blocks: map_entry takes the check; stop_checking drops it, mapping closed.
    monkeypatch.setenv("INFERD_CACHE", str(tmp_path))
    source = tmp_path / "model.gguf"
    source.write_bytes(b"gguf")
    path = weight_cache.entry_path(source, "blocks", 0, 1)
    weight_cache.write_entry(path, {"t": torch.arange(4.0)}, {}, {"model": str(source)})
    weight_cache.start_checking(path)
    weight_cache.start_checking(path)  # twice is once
    check = weight_cache._checks[path]
    mapped, _, _ = weight_cache.map_entry(path)
    assert mapped is check.mapped and path not in weight_cache._checks
    weight_cache.start_checking(path)
    dropped = weight_cache._checks[path]
    weight_cache.stop_checking(path)
    assert path not in weight_cache._checks and dropped.mapped.closed
    weight_cache.stop_checking(path)  # nothing to drop: no error

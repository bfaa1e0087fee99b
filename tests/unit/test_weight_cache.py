"""Cache entries under weights/: each a .safetensors with a .json that says what it is; the
oldest beyond `KEEP` go when one is written, and files of earlier versions (no .json: the
dense, sometimes float32, copies inferd used to write) are removed."""

from __future__ import annotations

import json
import os

import torch

from inferd.loader import weight_cache


def test_entries_say_what_they_hold_and_old_ones_go(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERD_CACHE", str(tmp_path))
    legacy = tmp_path / "weights" / "0123.safetensors"
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(b"an old float32 copy")
    source = tmp_path / "model.gguf"
    source.write_bytes(b"gguf")
    paths = []
    for i in range(weight_cache.KEEP + 2):
        path = weight_cache.entry_path(source, f"mode-{i}", 0, 1)
        ok = weight_cache.write_entry(path, {"t": torch.arange(4.0)}, {"k": "v"},
                                      {"model": str(source), "mode": f"mode-{i}"})  # fmt: skip
        assert ok
        os.utime(path, (i, 1_000_000 + i))  # written in this order
        paths.append(path)
    entries = weight_cache.entries()
    assert [e.path for e in entries] == paths[-weight_cache.KEEP :]
    assert not legacy.exists()
    info = json.loads(paths[-1].with_suffix(".json").read_text())
    assert info["mode"] == f"mode-{weight_cache.KEEP + 1}" and info["model"] == str(source)
    assert info["bytes"] == paths[-1].stat().st_size == entries[-1].bytes
    weight_cache.remove(entries[0])
    assert not entries[0].path.exists() and not entries[0].path.with_suffix(".json").exists()
    mapped, header, base = weight_cache.map_entry(paths[-1])
    assert header["__metadata__"] == {"k": "v"} and base > 8


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
    # engine/setup.py starts verifying a GGUF file's entry before it knows whether the model
    # keeps blocks: map_entry takes the check; stop_checking drops it, mapping closed.
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

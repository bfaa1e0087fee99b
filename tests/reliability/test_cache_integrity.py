"""Every cached file is checked before use (inferd/cache.py): damaged by random bytes, cut short
or with a broken header, it is logged with its path, deleted and rebuilt, never used. Unit level,
per kind of entry, in milliseconds; the end-to-end case (a server started on a damaged cache
answers right) is in test_damaged_cache_server.py."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest
import torch

from inferd import cache
from inferd.loader import weight_cache
from inferd.tokenizer import gguf_backend, gguf_vocab


def damage(path, how: str) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        if how == "random":
            f.seek(size // 3)
            f.write(os.urandom(max(1, size // 3)))
        elif how == "truncate":
            f.truncate(size // 2)
        elif how == "header":
            f.write(b"\xff" * min(16, size))
        else:
            raise AssertionError(how)


def warned_about(caplog, path) -> bool:
    return any(r.levelno == logging.WARNING and str(path) in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("how", ["random", "truncate", "header"])
def test_a_damaged_file_is_reported_deleted_and_not_verified(tmp_path, caplog, how):
    path = tmp_path / "entry.bin"
    tmp = tmp_path / "entry.bin.part"
    tmp.write_bytes(os.urandom(4096))
    cache.publish(tmp, path)
    assert cache.verified(path) and not tmp.exists()
    damage(path, how)
    with caplog.at_level(logging.WARNING):
        assert not cache.verified(path)
    assert warned_about(caplog, path)
    assert not path.exists() and not cache.sum_path(path).exists()


def test_a_file_without_a_checksum_is_not_trusted(tmp_path, caplog):
    path = tmp_path / "foreign.bin"
    path.write_bytes(b"written by something else")
    with caplog.at_level(logging.WARNING):
        assert not cache.verified(path)
    assert warned_about(caplog, path) and not path.exists()
    assert not cache.verified(tmp_path / "missing.bin")  # absent: nothing to say


def test_checksums_of_a_file_and_of_its_bytes_agree(tmp_path):
    data = os.urandom(3 * 1024 + 7)
    (tmp_path / "f").write_bytes(data)
    assert cache.checksum_of(tmp_path / "f") == cache.checksum_of_buffer(data)
    assert cache.checksum_of_buffer(data) != cache.checksum_of_buffer(data[:-1] + b"\0")


def test_checksum_of_a_file_reads_it_through_one_small_buffer(tmp_path):
    """Several chunks and a partial one agree with the bytes' checksum, and the file is never
    held in memory (a big freed block stays resident in a loader thread's arena)."""
    import tracemalloc

    data = os.urandom(6 * cache._CHUNK + 7)
    (tmp_path / "f").write_bytes(data)
    tracemalloc.start()
    try:
        got = cache.checksum_of(tmp_path / "f")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == cache.checksum_of_buffer(data)
    assert peak < 1 << 20 < len(data)


def _weight_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERD_CACHE", str(tmp_path))
    source = tmp_path / "model.gguf"
    source.write_bytes(b"gguf")
    path = weight_cache.entry_path(source, "blocks", 0, 1)
    tensors = {"w": torch.arange(4096, dtype=torch.float32)}
    assert weight_cache.write_entry(path, tensors, {"layout": "[]"}, {"model": str(source)})
    return path


@pytest.mark.parametrize("early", [False, True], ids=["checked-at-map", "checked-in-thread"])
@pytest.mark.parametrize("how", ["random", "truncate", "header"])
def test_a_damaged_weight_entry_is_never_mapped(tmp_path, monkeypatch, caplog, how, early):
    path = _weight_entry(tmp_path, monkeypatch)
    if early:  # the checksum computed beside other work (setup.py), then taken by map_entry
        weight_cache.start_checking(path)
    mapped, header, base = weight_cache.map_entry(path)
    assert torch.equal(
        torch.frombuffer(mapped, dtype=torch.float32, count=4096, offset=base),
        torch.arange(4096, dtype=torch.float32),
    )
    mapped.close()
    damage(path, how)
    if early:
        weight_cache.start_checking(path)
    with caplog.at_level(logging.WARNING):
        assert weight_cache.map_entry(path) is None
    assert warned_about(caplog, path)
    assert not path.exists() and not path.with_suffix(".json").exists()


def test_a_weight_entry_whose_description_is_lost_is_rebuilt(tmp_path, monkeypatch, caplog):
    path = _weight_entry(tmp_path, monkeypatch)
    path.with_suffix(".json").write_text(json.dumps({"model": "x"}))  # no checksum
    with caplog.at_level(logging.WARNING):
        assert weight_cache.map_entry(path) is None
    assert warned_about(caplog, path) and not path.exists()


def _tiny_vocab() -> gguf_vocab.GGUFVocab:
    tokens = ["a", "b", "c", "ab", "abc", "<|end|>"]
    types = np.array([1, 1, 1, 1, 1, 3])
    return gguf_vocab.GGUFVocab("gpt2", "", "qwen2", tokens, types, None, ["a b", "ab c"])


@pytest.mark.parametrize("how", ["random", "truncate", "header"])
def test_a_damaged_tokenizer_cache_is_rebuilt(tmp_path, caplog, how):
    vocab = _tiny_vocab()
    built = gguf_backend.load_gguf_backend(vocab, tmp_path)
    path = tmp_path / f"{vocab.cache_key()}.json"
    assert cache.verified(path)
    expected = built.encode("abcab").ids
    damage(path, how)
    with caplog.at_level(logging.WARNING):
        rebuilt = gguf_backend.load_gguf_backend(vocab, tmp_path)
    assert warned_about(caplog, path)
    assert rebuilt.encode("abcab").ids == expected == [4, 3]
    assert cache.verified(path)  # written again, with its checksum


def test_a_damaged_structured_token_cache_is_rebuilt(tmp_path, caplog):
    from inferd.structured import tokenizer_info

    path = tmp_path / "tokens.npz"
    tokens, special = [b"a", b"bc", b"", b"\xff"], [2]
    tokenizer_info._save(path, tokens, special)
    assert tokenizer_info._load(path) == (tokens, special)
    damage(path, "random")
    with caplog.at_level(logging.WARNING):
        assert tokenizer_info._load(path) is None
    assert warned_about(caplog, path) and not path.exists()


def test_a_damaged_kernel_library_is_compiled_again(tmp_path, monkeypatch, caplog):
    from inferd.cpu_kernels import build

    try:
        build.compiler()
    except build.KernelsUnavailable as e:
        pytest.skip(f"no C compiler here: {e}")
    monkeypatch.setenv("INFERD_CACHE", str(tmp_path))
    path, first = build.build("portable")
    assert first is not None and cache.verified(path)
    assert build.build("portable") == (path, None)  # intact: loaded from the cache
    damage(path, "truncate")  # loading this would end the process with SIGBUS
    with caplog.at_level(logging.WARNING):
        again, seconds = build.build("portable")
    assert again == path and seconds is not None and warned_about(caplog, path)
    build.load(path, "portable")  # the rebuilt library loads and passes its ISA check


def _stamped_model(tmp_path, monkeypatch):
    import hashlib
    from dataclasses import replace

    from inferd.loader import catalog

    monkeypatch.setenv("INFERD_CACHE", str(tmp_path))
    model = replace(catalog.SMOLLM2_INSTRUCT, file_name="tiny.gguf")
    model.path.parent.mkdir(parents=True)
    model.path.write_bytes(b"GGUF" + os.urandom(4096))
    digest = hashlib.sha256(model.path.read_bytes()).hexdigest()
    stamp = {"sha256": digest, "file": catalog.file_identity(model.path)}
    model.stamp_path.write_text(json.dumps(stamp))
    return catalog, model, digest


@pytest.mark.parametrize("how", ["random", "truncate", "header"])
def test_a_damaged_model_file_is_deleted_not_loaded(tmp_path, monkeypatch, caplog, how):
    catalog, model, _ = _stamped_model(tmp_path, monkeypatch)
    assert catalog.verify_file(model)
    damage(model.path, how)
    with caplog.at_level(logging.WARNING):
        assert not catalog.verify_file(model)
    assert warned_about(caplog, model.path)
    assert not model.path.exists() and not model.stamp_path.exists()


def test_a_damaged_stamp_costs_one_check_not_the_start(tmp_path, monkeypatch):
    catalog, model, digest = _stamped_model(tmp_path, monkeypatch)
    model.stamp_path.write_text("1")  # valid JSON, not a stamp
    assert catalog.verify_file(model, expected_sha256=digest)  # re-hashed: intact
    assert catalog.read_stamp(model)["sha256"] == digest and catalog.is_present(model)

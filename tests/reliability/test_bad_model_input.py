"""A model the user points at that cannot be used gives one clear error naming the problem:
exit code 2 from the CLI, no traceback; `ModelLoadError` from Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from inferd.errors import ModelLoadError
from inferd.loader import open_checkpoint


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "inferd", "generate", "hello", "--max-tokens", "2", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def bad_models(tmp_path: Path, gemma_gguf: Path) -> dict[str, tuple[Path, str]]:
    """name → (path, words the error must contain)."""
    not_model = tmp_path / "notes.txt"
    not_model.write_text("just some text, not weights")
    pickle_dir = tmp_path / "pickled"
    pickle_dir.mkdir()
    (pickle_dir / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    arch_dir = tmp_path / "bert"
    arch_dir.mkdir()
    (arch_dir / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    truncated = tmp_path / "truncated.gguf"
    with open(gemma_gguf, "rb") as f:
        truncated.write_bytes(f.read(20_000_000))  # header intact, tensor data cut short
    header_cut = tmp_path / "header_cut.gguf"
    with open(gemma_gguf, "rb") as f:
        header_cut.write_bytes(f.read(1000))
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    return {
        "missing": (tmp_path / "does-not-exist", "does not exist"),
        "not a model": (not_model, "not a GGUF file"),
        "pickle file": (pickle_dir / "pytorch_model.bin", "pickle"),
        "pickle folder": (pickle_dir, "pickle"),
        "unsupported architecture": (arch_dir, "unsupported architecture"),
        "truncated gguf": (truncated, "truncated"),
        "gguf header cut": (header_cut, "truncated"),
        "empty folder": (empty_dir, "not a model"),
    }


@pytest.fixture
def cases(tmp_path, gemma_gguf):
    return bad_models(tmp_path, gemma_gguf)


def test_python_api_raises_model_load_error(cases):
    for name, (path, words) in cases.items():
        with pytest.raises(ModelLoadError) as err:
            open_checkpoint(path)
        assert words in str(err.value), name
        assert str(path) in str(err.value) or name == "unsupported architecture", name


def test_cli_prints_one_line_and_exits_2(cases):
    # the runs are independent and mostly interpreter start-up: side by side, not in turn
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        runs = dict(zip(cases, pool.map(lambda c: run_cli("--model", str(c[0])), cases.values())))
    for name, (_path, words) in cases.items():
        res = runs[name]
        assert res.returncode == 2, (name, res.stderr)
        assert "Traceback" not in res.stderr, name
        assert words in res.stderr, (name, res.stderr)
        assert res.stdout == "", name


def test_pickle_is_never_unpickled(tmp_path):
    # A real pickle whose loading would create a file: refusing must leave no trace.
    marker = tmp_path / "pwned"
    payload = (
        b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
    )  # a classic os.system pickle
    folder = tmp_path / "evil"
    folder.mkdir()
    (folder / "model.pt").write_bytes(payload)
    with pytest.raises(ModelLoadError):
        open_checkpoint(folder)
    assert not marker.exists()

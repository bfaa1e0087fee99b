"""`inferd bench startup`'s cold runs: each in a fresh, empty INFERD_CACHE holding only links to
pulled models, removed afterwards; each run's wall and CPU seconds recorded."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from inferd.bench import startup

# Writes one byte, then burns a little CPU before exiting.
PROBE = "import sys; sys.stdout.write('x'); sys.stdout.flush(); sum(i * i for i in range(300000))"


def test_cold_runs_get_a_fresh_cache_each_with_the_pulled_models(tmp_path, monkeypatch):
    pulled = tmp_path / "model.gguf"
    pulled.write_bytes(b"GGUF")
    pulled.with_suffix(".verified.json").write_text("{}")
    seen = []

    def fake_run(cmd, timeout=600.0, env=None):
        cache = Path(env["INFERD_CACHE"])
        seen.append((cache, sorted(p.name for p in (cache / "models").iterdir())))
        assert (cache / "models" / "model.gguf").resolve() == pulled.resolve()
        return 1.5, 1.25

    monkeypatch.setattr(startup, "timed_run", fake_run)
    result = startup.run_cold("inferd", ["x"], 2, [pulled])
    assert result.cache == "cold" and result.seconds == [1.5, 1.5]
    assert result.cpu_seconds == [1.25, 1.25]
    assert seen[0][1] == ["model.gguf", "model.verified.json"]
    assert seen[0][0] != seen[1][0] and not any(cache.exists() for cache, _ in seen)
    assert os.environ.get("INFERD_CACHE") != str(seen[0][0])


def test_timed_run_measures_the_first_byte_and_the_child_cpu():
    elapsed, cpu = startup.timed_run([sys.executable, "-c", PROBE])
    assert 0 < elapsed < 60 and cpu > 0
    with pytest.raises(RuntimeError, match="exited 3"):
        startup.timed_run([sys.executable, "-c", "import sys; sys.exit(3)"])
    with pytest.raises(ValueError, match="cold-runs"):
        startup.run_cold("inferd", ["x"], 0)


def test_warm_runs_let_python_cache_its_bytecode(monkeypatch):
    """With PYTHONDONTWRITEBYTECODE every start would compile the modules again: the warm runs
    (warm-up included) go without it, and with the rest of the environment as it is."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("INFERD_PROBE", "kept")
    envs = []

    def fake_run(cmd, timeout=600.0, env=None):
        envs.append(env)
        return 1.0, 0.5

    monkeypatch.setattr(startup, "timed_run", fake_run)
    [result] = startup.run_startup({"inferd": ["x"]}, 2)
    assert result.seconds == [1.0, 1.0] and len(envs) == 3
    assert all("PYTHONDONTWRITEBYTECODE" not in env and env["INFERD_PROBE"] == "kept"
               for env in envs)  # fmt: skip

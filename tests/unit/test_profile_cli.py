"""`--profile DIR` on the command line: refused before anything loads when it cannot work, and a
trace with its top-ops table from `inferd generate` on the embedded model."""

from __future__ import annotations

import json

import pytest

from inferd import cli


def test_bench_profile_refuses_peers_before_loading(capsys, tmp_path):
    code = cli.main(["bench", "latency", "--profile", str(tmp_path), "--compare", "llamacpp"])
    assert code != 0
    assert "--profile traces inferd alone: drop --compare" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["generate", "hi"], ["bench", "throughput"]])
def test_an_unwritable_profile_directory_fails_before_loading(capsys, tmp_path, command):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cli.main([*command, "--profile", str(blocker / "traces")]) != 0
    err = capsys.readouterr().err
    assert "profiler directory" in err and "cannot be created" in err


@pytest.mark.slow
def test_generate_profile_writes_a_trace_and_prints_the_top_ops(capsys, tmp_path):
    code = cli.main(["generate", "The sky is", "--max-tokens", "3", "--ignore-eos",
                     "--profile", str(tmp_path)])  # fmt: skip
    assert code == 0
    err = capsys.readouterr().err
    assert "[inferd] trace of 3 steps:" in err and "Self CPU" in err
    (trace,) = tmp_path.glob("*.trace.json")
    (ops,) = tmp_path.glob("*.ops.txt")
    names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
    assert {"inferd.step", "inferd.forward", "inferd.sample", "layer.0"} <= names
    assert ops.read_text().startswith("3 engine steps")

"""`inferd plan --check` end to end on a tiny random Llama (a short run: 3 tokens a point), with
this machine's peaks and step model given rather than measured; and `--plot`. Asserts the
points' shape and that every figure was measured, never a timing."""

from __future__ import annotations

import json

import pytest

from inferd.plan.machine_peaks import MachinePeaks
from inferd.plan.step_model import StepModel, StepOverhead
from tests.tiny_gguf import write_tiny_gguf

PEAKS = MachinePeaks("test box", 2, 8 << 30, 20e9, {"float32": 50e9, "q8_0": 100e9})


def test_check_json_points_on_a_tiny_model(tmp_path, monkeypatch, capsys):
    from inferd import cli
    from inferd.commands import plan as plan_command

    path = tmp_path / "tiny-llama.gguf"
    write_tiny_gguf(path, "llama")
    monkeypatch.setenv("INFERD_WEIGHT_CACHE", "0")  # a test file's blocks stay out of the cache
    model = StepModel(PEAKS, 1.0, 1.0, StepOverhead(1e-3, 0.0, 1e-5, 256, "given"))
    monkeypatch.setattr(plan_command, "_this_machine", lambda refresh: (PEAKS, model, True))
    assert cli.main(["plan", "--check", str(path), "--json", "--output-len-check", "3"]) == 0
    points = json.loads(capsys.readouterr().out)
    keys = {"metric", "batch", "input_len", "output_len", "predicted", "measured"}
    assert all(set(p) == keys for p in points)
    assert [(p["metric"], p["batch"]) for p in points] == [
        ("tpot_s", 1), ("output_tok_s", 1), ("tpot_s", 8), ("output_tok_s", 8),
        ("tpot_s", 32), ("output_tok_s", 32), ("prefill_s", 1)]  # fmt: skip
    assert all(p["predicted"] > 0 and p["measured"] > 0 for p in points)
    assert points[-1]["input_len"] == 255  # 512 where the model holds it; this one holds 256


def test_plot_draws_a_file(tmp_path):
    pytest.importorskip("matplotlib")
    from inferd.plan.model_facts import load_model
    from inferd.plan.planner import make_plan
    from inferd.plan.plot import plot_plan
    from inferd.plan.predict import Workload
    from tests.unit.test_plan import profile_hardware

    plan = make_plan(load_model(None, "llama", "7B"), profile_hardware("h100-sxm"),
                     Workload(512, 128, 8, None, 0.5, 0.05), ["bf16"])  # fmt: skip
    out = tmp_path / "plan.png"
    plot_plan(str(out), plan)
    assert out.stat().st_size > 10_000

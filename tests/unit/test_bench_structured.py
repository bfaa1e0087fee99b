"""`inferd bench latency --structured-outputs` / `--preset json`: the spec flag, the preset, and
one constrained-vs-free latency run on a tiny random model (every constrained request generates
its full output length, and the grammar's cost per token is reported)."""

from __future__ import annotations

import argparse

import pytest
from tiny_models import make_tiny_checkpoint

from inferd import cli
from inferd.bench.constrained import ConstrainedSystem, parse_spec
from inferd.bench.latency import latency_batches, run_latency
from inferd.bench.presets import PRESETS, resolve_workload
from inferd.bench.systems import InferdSystem
from inferd.bench.workload import workload_vocab
from inferd.commands import bench
from inferd.config import EngineConfig
from inferd.errors import InvalidRequest


def test_the_spec_flag_and_the_json_preset():
    assert parse_spec('{"regex": "[a-z]+"}').regex == "[a-z]+"
    with pytest.raises(ValueError, match="--structured-outputs must be JSON"):
        parse_spec("{regex")
    with pytest.raises(InvalidRequest, match="unsupported parameter: structured_outputs.re"):
        parse_spec('{"re": "a"}')
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["latency", "--preset", "json"])
    spec = bench._structured_spec(args)
    assert spec.json["properties"]["answer"]["minLength"] > 4 * PRESETS["json"]["output_len"][1]
    args = parser.parse_args(["latency", "--structured-outputs", '{"choice": ["a"]}'])
    assert bench._structured_spec(args).choice == ["a"]
    assert bench._structured_spec(parser.parse_args(["latency", "--preset", "single"])) is None


def test_constrained_and_free_run_side_by_side(tmp_path):
    folder = make_tiny_checkpoint("llama", tmp_path / "llama")
    free = InferdSystem(EngineConfig(model=str(folder), dtype="float32",
                                     kv_cache_memory=16 << 20, max_model_len=128))  # fmt: skip
    constrained = ConstrainedSystem(free, bench._structured_spec(
        argparse.Namespace(structured_outputs=None, preset="json")))  # fmt: skip
    workload = resolve_workload("json", input_len=40, output_len=12, range_ratio=0.0,
                                num_prompts=2, seed=0, default_prompts=1)  # fmt: skip
    warm, batches = latency_batches(workload, workload_vocab(free.tokenizer), 0, 1)
    results = run_latency([constrained, free], warm, batches)
    assert [r.system for r in results] == ["inferd+json", "inferd"]
    for r in results:
        assert r.notes == [] and r.metrics.total_output_tokens == 24  # full length, both
    # One engine serves both: each reports the steps of its own iterations only (2 prompts
    # prefilled in one step, then 11 decode steps for the other 11 tokens).
    for r in results:
        assert [(b.kind, b.steps) for b in r.step_phases] == [("decode", 11), ("prefill", 1)]
        # each prefills both whole prompts: the second to run finds none of the first's blocks
        assert r.step_phases[1].tokens_per_step == 80
    costs = constrained.constraint_costs()
    assert costs.startswith("24 constrained tokens: ") and "µs per token" in costs
    free.llm.shutdown()


def test_profile_is_refused_with_structured_outputs_before_loading(capsys, tmp_path):
    code = cli.main(["bench", "latency", "--preset", "json", "--profile", str(tmp_path),
                     "--model", str(tmp_path / "no-such-model")])  # fmt: skip
    assert code != 0
    assert "--profile traces one run: drop --structured-outputs" in capsys.readouterr().err

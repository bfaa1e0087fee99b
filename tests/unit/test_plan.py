"""`inferd plan`'s math and its answers to bad input: the roofline of a step (which bound, and
the time), the all-reduce cost, the profiles table (every figure with a source), the planner's
refusals (unknown hardware, a model that fits nowhere, SLOs no configuration meets) and the
JSON shapes. Config-only models and named profiles: nothing is loaded or measured here."""

from __future__ import annotations

import argparse
import json

import pytest

from inferd.plan import hardware_profiles as hp
from inferd.plan.check import CheckPoint
from inferd.plan.interconnects import all_reduce_seconds, interconnect
from inferd.plan.model_facts import load_model, parse_params
from inferd.plan.planner import Hardware, PlanError, make_plan, slo_failure
from inferd.plan.predict import Workload
from inferd.plan.report import plan_dict
from inferd.plan.roofline import StepWork, roofline_time
from inferd.plan.step_model import profile_step_model


def flat(rate):
    return lambda fmt, rows: rate


def test_a_step_reading_more_than_it_computes_is_memory_bound():
    work = StepWork(rows=1, weight_bytes=10e9, kv_bytes=0, other_bytes=0,
                    matrix_flops={"bfloat16": 20e9})  # fmt: skip
    t = roofline_time(work, bandwidth=1e12, flops_at=flat(100e12), overhead_s=1e-3)
    assert t.bound == "memory"
    assert t.memory_s == pytest.approx(10e-3) and t.compute_s == pytest.approx(0.2e-3)
    assert t.time_s == pytest.approx(11e-3)  # the larger of the two, plus the overhead
    assert t.intensity == pytest.approx(2.0) and t.balance == pytest.approx(100.0)
    assert "below the device's balance" in t.why()


def test_a_step_computing_more_than_it_reads_is_compute_bound():
    work = StepWork(rows=4096, weight_bytes=10e9, kv_bytes=1e9, other_bytes=0,
                    matrix_flops={"bfloat16": 4096 * 10e9})  # fmt: skip
    t = roofline_time(work, bandwidth=1e12, flops_at=flat(500e12))
    assert t.bound == "compute" and t.time_s == pytest.approx(4096 * 10e9 / 500e12)


def test_each_format_runs_at_its_own_rate():
    work = StepWork(rows=8, weight_bytes=0, kv_bytes=0, other_bytes=1,
                    matrix_flops={"q4_k": 1e9, "q8_0": 1e9})  # fmt: skip
    rates = {"q4_k": 1e9, "q8_0": 2e9}
    t = roofline_time(work, 1e12, lambda fmt, rows: rates[fmt])
    assert t.compute_s == pytest.approx(1.5)


def test_ring_all_reduce_cost():
    link = interconnect("nvlink4")
    assert all_reduce_seconds(1e6, 1, link) == 0.0
    four = all_reduce_seconds(1e6, 4, link)
    assert four == pytest.approx(2 * 3 / 4 * 1e6 / link.bandwidth_bytes_s + 6 * link.latency_s)
    assert all_reduce_seconds(1e6, 4, interconnect("pcie4")) > four


def test_every_profile_has_a_source_and_sane_figures():
    assert {"h100-sxm", "h100-pcie", "h200", "a100-40gb", "a100-80gb", "l40s", "rtx-4090",
            "rtx-4060-laptop", "epyc-ddr5", "xeon-ddr5"} <= set(hp.known_names())  # fmt: skip
    for p in hp.PROFILES:
        assert len(p.source) > 30, p.name
        assert p.memory_bytes > 4 * 2**30 and p.memory_bandwidth_bytes_s > 100e9
        assert p.flops_s["bfloat16"] > 1e12 and p.tdp_watts > 0
        interconnect(p.interconnect)  # a known link
    assert hp.profile("H200").memory_bandwidth_bytes_s == 4.8e12
    assert "fp8" not in hp.profile("a100-80gb").flops_s  # no FP8 tensor cores


def test_an_unknown_hardware_name_lists_the_known():
    with pytest.raises(ValueError, match="unknown hardware 'tpu9'.*h100-sxm.*xeon-ddr5"):
        hp.profile("tpu9")


def test_params_parse_and_shapes():
    assert parse_params("7B") == 7_000_000_000 and parse_params("270m") == 270_000_000
    with pytest.raises(ValueError, match="--params"):
        parse_params("seven")
    facts = load_model(None, "llama", "70B")
    assert facts.name == "Llama 3.1 70B" and 69e9 < facts.params < 72e9
    with pytest.raises(ValueError, match="known families"):
        load_model(None, "gpt9", "7B")
    with pytest.raises(ValueError, match="together"):
        load_model(None, "llama", None)


def profile_hardware(name: str, devices: int = 1) -> Hardware:
    p = hp.profile(name)
    peaks = p.peaks()
    return Hardware(p.name, p.description, p.kind, peaks, profile_step_model(peaks), devices,
                    interconnect(p.interconnect), p.tdp_watts, 2.0, p.source)  # fmt: skip


def test_a_7b_model_on_one_gpu_plans_every_precision():
    w = Workload(1024, 256, 16, None, 1.0, 0.05)
    plan = make_plan(load_model(None, "llama", "7B"), profile_hardware("h100-sxm"), w)
    names = [e.candidate.name for e in plan.evaluated]
    assert names == ["bf16 TP=1 PP=1 DP=1", "fp8 TP=1 PP=1 DP=1", "int8 TP=1 PP=1 DP=1",
                     "int4 TP=1 PP=1 DP=1"]  # fmt: skip
    bf16 = plan.evaluated[0].at_workload
    assert bf16.decode.bound == "memory"  # decode of 16 sequences streams the weights
    assert bf16.tpot_p99_s >= bf16.tpot_s  # a step with a prefill chunk is the slow one
    # fp8 reads half the weights: a faster decode step
    assert plan.evaluated[1].at_workload.decode.time_s < bf16.decode.time_s


def test_tensor_parallel_adds_all_reduce_time():
    w = Workload(512, 128, 8)
    plan = make_plan(load_model(None, "llama", "70B"), profile_hardware("h100-sxm", 4), w,
                     ["bf16"])  # fmt: skip
    by_name = {e.candidate.name: e for e in plan.evaluated}
    tp4 = by_name["bf16 TP=4 PP=1 DP=1"].at_workload
    assert tp4.all_reduce_s > 0
    assert by_name["bf16 TP=1 PP=4 DP=1"].at_workload.all_reduce_s == 0
    assert any("TP=1 PP=1 DP=4" in c.name for c, _ in plan.rejected)  # 140 GB on 80 GB


def test_a_model_that_fits_nowhere_says_by_how_much():
    w = Workload(1024, 256, 1)
    with pytest.raises(PlanError, match=r"fits no configuration.*GiB more than a device holds"):
        make_plan(load_model(None, "llama", "70B"), profile_hardware("rtx-4060-laptop"), w)


def test_slos_no_configuration_meets_say_the_best_reachable():
    w = Workload(1024, 256, 4, None, 1e-6, 1e-6)
    plan = make_plan(load_model(None, "llama", "7B"), profile_hardware("h200"), w)
    assert not any(e.best_under_slo for e in plan.evaluated)
    message = slo_failure(plan)
    assert "no configuration meets TTFT p99" in message and "best reachable" in message


def test_plan_json_shape():
    w = Workload(512, 128, 8, None, 2.0, 0.1)
    out = plan_dict(make_plan(load_model(None, "llama", "7B"), profile_hardware("l40s"), w))
    json.dumps(out)  # plain data
    assert {"model", "hardware", "workload", "candidates", "best", "checklist"} <= out.keys()
    items = [c["item"] for c in out["checklist"]]
    assert items[0] == "model size, quantised" and "software SLA" in items
    first = out["candidates"][0]
    assert {"memory_per_device", "at_workload", "best_under_slo", "tokens_per_joule",
            "cost_per_million_tokens"} <= first.keys()  # fmt: skip


def test_check_points_are_the_documented_shape():
    point = CheckPoint("tpot_s", 8, 32, 16, 0.05, 0.04)
    assert set(point.to_dict()) == {"metric", "batch", "input_len", "output_len", "predicted",
                                    "measured"}  # fmt: skip
    assert point.error == pytest.approx(0.25)


def test_cli_refuses_bad_input_by_name(capsys):
    from inferd import cli

    assert cli.main(["plan", "--hardware", "tpu9", "--arch", "llama", "--params", "7B"]) == 2
    assert "known: this" in capsys.readouterr().err
    assert cli.main(["plan", "--arch", "llama", "--params", "7B", "--hardware", "h200",
                     "--rate", "1", "--concurrency", "2"]) == 2  # fmt: skip
    assert "not both" in capsys.readouterr().err
    assert cli.main(["plan", "--check", "--concurrency", "4"]) == 2
    assert "--concurrency: not read by --check" in capsys.readouterr().err
    assert cli.main(["plan", "--arch", "llama", "--params", "7B", "--clock", "cpu"]) == 2
    assert "--clock: only read by --check" in capsys.readouterr().err


def test_cli_plan_json_on_a_profile(capsys):
    from inferd import cli

    rc = cli.main(["plan", "--arch", "llama", "--params", "70B", "--hardware", "h200",
                   "--devices", "4", "--precision", "bf16", "--json",
                   "--tpot-p99", "100ms"])  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["hardware"]["devices"] == 4 and out["best"]


def test_durations_parse():
    from inferd.commands.plan import parse_duration

    assert parse_duration("200ms") == pytest.approx(0.2) and parse_duration("1.5") == 1.5
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration("soon")


def test_the_overhead_fit_recovers_known_overheads():
    from inferd.plan.candidates import Layout, build_candidate
    from inferd.plan.machine_peaks import MachinePeaks
    from inferd.plan.step_model import StepModel, StepOverhead, fit_overhead

    peaks = MachinePeaks("box", 2, 16 << 30, 20e9, {"float32": 60e9})
    facts = load_model(None, "qwen2", "0.5B")
    c = build_candidate(facts, "fp32", Layout(), device="cpu", capacity=peaks.memory_bytes,
                        context=256, concurrency=1, peaks_flops=peaks.flops_s)  # fmt: skip
    size = facts.config.num_layers * facts.config.hidden_size
    truth = StepModel(peaks, 1.0, 1.0, StepOverhead(0.004, 0.0, 2e-5, size, "", 0.010))
    points = [
        {"kind": "decode", "rows": n, "context": 24, "seconds": truth.decode(c.slice, n, 24).time_s}
        for n in (1, 2, 4)
    ]
    points += [{"kind": "prefill", "rows": n, "context": 0,
                "seconds": truth.prefill(c.slice, n).time_s} for n in (16, 64, 128)]  # fmt: skip
    fitted = fit_overhead(points, c.slice, peaks)
    assert fitted.fixed_s == pytest.approx(0.004, rel=1e-6)
    assert fitted.prefill_s == pytest.approx(0.010, rel=1e-6)
    assert fitted.per_token_s == pytest.approx(2e-5, rel=1e-6)


def test_throughput_by_rows_interpolates_between_measured_rows():
    from inferd.plan.machine_peaks import MachinePeaks

    peaks = MachinePeaks("box", 2, 1 << 30, 1e9, {"q4_k": 100.0},
                         flops_s_by_rows={"q4_k": {"1": 10.0, "4": 30.0, "16": 90.0}})  # fmt: skip
    assert peaks.flops_at("q4_k", 1) == 10.0 and peaks.flops_at("q4_k", 64) == 90.0
    assert peaks.flops_at("q4_k", 2) == pytest.approx(20.0)  # halfway in log(rows)
    assert peaks.flops_at("q8_0", 2) == 100.0  # no curve: the peak

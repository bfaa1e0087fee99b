"""MBU / MFU and the steps' bytes and FLOPs in /metrics
(inferd/server/metrics/efficiency_metrics.py), from an engine's EfficiencyMeter on tiny layers:
with peaks, without them, and from engines that count nothing (milliseconds, no model file)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from inferd.engine_client import EngineStats
from inferd.profiling.efficiency_meter import EfficiencyMeter
from inferd.profiling.model_traffic import ModelTraffic
from inferd.server.metrics.prometheus import ServerMetrics
from inferd.step_efficiency import PeakRates
from tests.unit.test_step_efficiency import KV_TOKEN_BYTES, TinyModel, tiny_config

PEAKS = PeakRates("test machine", 2.0e9, {"float32": 1.0e9})
DECODE = '{engine="0",model_name="m",step_kind="decode"}'


def sample(text: str, line_start: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith(line_start))
    return float(line.rsplit(" ", 1)[1])


def traffic() -> ModelTraffic:
    return ModelTraffic.of_model(TinyModel(), tiny_config(), KV_TOKEN_BYTES, torch.float32)


def decode_row(start: int):
    return SimpleNamespace(num_computed=start, num_new_tokens=1, draft_token_ids=[],
                           needs_logits=True, prompt_logprobs=False)  # fmt: skip


def stats_of(meter: EfficiencyMeter) -> EngineStats:
    return EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0, 2, step_efficiency=meter.snapshot())


def test_mbu_mfu_bytes_and_flops_with_peaks():
    t = traffic()
    meter = EfficiencyMeter(t, lambda: PEAKS)
    for start, seconds in ((5, 1e-6), (6, 4e-6)):
        meter.observe([decode_row(start)], seconds, prefill=False)
    text = ServerMetrics("m").render(stats_of(meter)).decode()
    works = [t.work([(5, 1, 1)]), t.work([(6, 1, 1)])]
    weights, kv = sum(w.weight_bytes for w in works), sum(w.kv_bytes for w in works)
    assert sample(text, "inferd:step_weight_bytes_read_total" + DECODE) == weights
    assert sample(text, "inferd:step_kv_bytes_read_total" + DECODE) == kv
    assert sample(text, "inferd:step_flops_total" + DECODE) == sum(w.total_flops for w in works)
    mbus = [works[0].bytes / 2e9 / 1e-6, works[1].bytes / 2e9 / 4e-6]
    assert sample(text, "inferd:step_mbu_count" + DECODE) == 2
    assert sample(text, "inferd:step_mbu_sum" + DECODE) == pytest.approx(sum(mbus))
    below = sum(m <= 0.5 for m in mbus)
    bucket = 'inferd:step_mbu_bucket{engine="0",le="0.5",model_name="m",step_kind="decode"}'
    assert sample(text, bucket) == below
    assert sample(text, "inferd:step_mfu_count" + DECODE) == 2
    memory = '{engine="0",limit="memory",model_name="m",step_kind="decode"}'
    assert sample(text, "inferd:step_roofline_seconds_total" + memory) == pytest.approx(
        sum(w.bytes for w in works) / 2e9)  # fmt: skip
    assert sample(text, "inferd:step_rated_seconds_total" + DECODE) == pytest.approx(5e-6)
    assert sample(text, 'inferd:machine_memory_bandwidth_bytes_per_second{engine="0"') == 2e9
    assert 'weight_format="float32"' in text


def test_without_peaks_only_bytes_and_flops():
    meter = EfficiencyMeter(traffic(), lambda: None)
    meter.observe([decode_row(5)], 1e-3, prefill=False)
    text = ServerMetrics("m").render(stats_of(meter)).decode()
    assert sample(text, "inferd:step_flops_total" + DECODE) > 0
    for name in ("step_mbu", "step_mfu", "step_roofline_seconds", "machine_memory_bandwidth"):
        assert f"inferd:{name}" not in text


def test_engines_that_count_nothing_render_no_series():
    metrics = ServerMetrics("m")
    text = metrics.render(EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0, 0)).decode()
    assert "step_flops" not in text and "step_mbu" not in text


def test_the_counts_cross_the_process_boundary_and_replicas_add_up():
    from inferd.engine.frontend.replica_stats import merge_stats
    from inferd.engine.transport import ipc

    meter = EfficiencyMeter(traffic(), lambda: PEAKS)
    meter.observe([decode_row(5)], 1e-6, prefill=False)
    stats = stats_of(meter)
    back = ipc.decode_from_core(ipc.encode(ipc.Outputs([], stats=stats))).stats
    assert back.step_efficiency == stats.step_efficiency
    merged = merge_stats([stats, back]).step_efficiency.kinds["decode"]
    one = stats.step_efficiency.kinds["decode"]
    assert (merged.steps, merged.weight_bytes) == (2, 2 * one.weight_bytes)
    assert merged.mean_mbu == pytest.approx(one.mean_mbu)


def test_ray_replicas_records_add_up_and_none_stays_none():
    from inferd.ray_serve.replica_board import add_stats

    meter = EfficiencyMeter(traffic(), lambda: PEAKS)
    meter.observe([decode_row(5)], 1e-6, prefill=False)
    counted, bare = stats_of(meter), EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0, 0)
    assert add_stats(bare, bare).step_efficiency is None
    assert add_stats(bare, counted).step_efficiency == counted.step_efficiency
    assert add_stats(counted, counted).step_efficiency.kinds["decode"].steps == 2

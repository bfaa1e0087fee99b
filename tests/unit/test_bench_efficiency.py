"""MBU / MFU in `inferd bench`'s report and JSON (inferd/bench/efficiency.py), with the machine's
peaks and without them, from a meter on tiny layers (milliseconds, no model file)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from test_step_efficiency import KV_TOKEN_BYTES, PEAKS, TinyModel, row, tiny_config

from inferd.bench.efficiency import TABLE_ROWS, efficiency_dict, efficiency_lines
from inferd.profiling.efficiency_meter import EfficiencyMeter
from inferd.profiling.model_traffic import ModelTraffic


def result_of(peaks) -> SimpleNamespace:
    traffic = ModelTraffic.of_model(TinyModel(), tiny_config(), KV_TOKEN_BYTES, torch.float32)
    meter = EfficiencyMeter(traffic, lambda: peaks)
    meter.observe([row(5, 1)], 1e-6, prefill=False)
    meter.observe([row(6, 1)], 3e-6, prefill=False)
    return SimpleNamespace(system="inferd", step_efficiency=meter.snapshot())


def test_the_report_shows_time_weighted_mbu_and_mfu_with_peaks():
    result = result_of(PEAKS)
    decode = result.step_efficiency.kinds["decode"]
    values = {label: get(result) for label, get in TABLE_ROWS}
    assert values["Decode MBU (%)"] == pytest.approx(100 * decode.memory_seconds / 4e-6)
    assert values["Decode MFU (%)"] == pytest.approx(100 * decode.compute_seconds / 4e-6)
    assert values["Prefill MBU (%)"] is None  # no prefill step ran
    (line, peaks) = efficiency_lines(result)
    assert line.startswith("inferd decode steps:") and "MBU" in line and decode.bound in line
    assert PEAKS.machine in peaks
    document = efficiency_dict(result.step_efficiency)
    assert document["decode"]["mbu"] == pytest.approx(decode.mean_mbu)
    assert "prefill" not in document and document["peaks"]["machine"] == PEAKS.machine
    json.dumps(document, allow_nan=False)


def test_without_peaks_the_report_says_unknown_and_counts_still_show():
    result = result_of(None)
    assert all(get(result) is None for _, get in TABLE_ROWS)
    (line,) = efficiency_lines(result)
    assert "read a step" in line and "unknown" in line
    document = efficiency_dict(result.step_efficiency)
    assert document["decode"]["mbu"] is None and document["decode"]["flops"] > 0
    assert document["peaks"] is None


def test_peers_have_no_efficiency():
    peer = SimpleNamespace(system="llamacpp", step_efficiency=None)
    assert efficiency_lines(peer) == [] and efficiency_dict(None) is None
    assert all(get(peer) is None for _, get in TABLE_ROWS)

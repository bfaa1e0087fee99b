"""The machine-peaks record: its cache round trip (keyed by the machine), and the fallback of a
weight format that was not measured. The measurement itself is not run here (seconds)."""

from __future__ import annotations

import pytest

from inferd.plan import kernel_rates
from inferd.plan import machine_peaks as mp

PEAKS = mp.MachinePeaks(
    name="test box",
    cores=2,
    memory_bytes=8 << 30,
    memory_bandwidth_bytes_s=20e9,
    flops_s={"float32": 80e9, "q4_k": 120e9, "q8_0": 130e9},
)


def test_unmeasured_formats_fall_back_to_the_closest_kind():
    assert PEAKS.flops_for("Q4_K") == 120e9
    assert PEAKS.flops_for("q5_k") == 125e9  # another block format: the blocks' median
    assert PEAKS.flops_for("bfloat16") == 80e9  # a dense one: float32's


def test_peaks_are_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERD_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(mp, "measure_machine_peaks", lambda: calls.append(1) or PEAKS)
    assert mp.machine_peaks() == PEAKS
    assert mp.machine_peaks() == PEAKS
    assert len(calls) == 1
    assert mp.cache_path().is_file()
    mp.machine_peaks(refresh=True)
    assert len(calls) == 2


def test_a_damaged_cache_entry_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERD_CACHE", str(tmp_path))
    monkeypatch.setattr(mp, "measure_machine_peaks", lambda: PEAKS)
    mp.machine_peaks()
    mp.cache_path().write_text("{}")  # checksum no longer matches
    calls = []
    monkeypatch.setattr(mp, "measure_machine_peaks", lambda: calls.append(1) or PEAKS)
    assert mp.machine_peaks() == PEAKS and calls == [1]


@pytest.mark.parametrize("fmt", sorted(kernel_rates.BLOCK_FORMATS))
def test_random_block_weights_have_finite_values(fmt):
    import torch

    pytest.importorskip("inferd.cpu_kernels").kernel_library()
    w = kernel_rates.random_block_weight(fmt, 32, 256)
    assert torch.isfinite(w.dequantized()).all()

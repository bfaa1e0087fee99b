"""The engine core's `EfficiencyMeter` (inferd/profiling/efficiency_meter.py): the loaded model
described once (inferd/profiling/model_traffic.py), and where the machine's peaks come from.

NOTE: the peaks are only read from the cache of an earlier measurement (`inferd plan`, `inferd
bench`, or `machine_peaks()` in Python: inferd/plan/machine_peaks.py). The engine never
measures: a few seconds of every core at start-up, or in the middle of serving, is a cost no
request should pay, and steps running meanwhile would spoil the measurement. Until a
measurement exists the meter's MBU and MFU are unknown; it looks for one every half minute.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from inferd.config import EngineConfig
from inferd.engine.execution.setup import EngineSetup
from inferd.profiling.efficiency_meter import EfficiencyMeter
from inferd.profiling.model_traffic import ModelTraffic
from inferd.step_efficiency import PeakRates

log = logging.getLogger(__name__)


def engine_meter(setup: EngineSetup, config: EngineConfig) -> EfficiencyMeter:
    """A meter of the engine's model; one that records nothing when the model cannot be
    described (an unexpected layer must never keep an engine from starting)."""
    try:
        traffic = model_traffic(setup, config)
    except Exception:
        log.exception("step efficiency: the model's bytes and FLOPs could not be counted")
        return EfficiencyMeter(None)
    return EfficiencyMeter(traffic, cached_peaks_source(traffic, setup.device.type))


def model_traffic(setup: EngineSetup, config: EngineConfig) -> ModelTraffic | None:
    model = setup.runner.model
    if model is None:
        return None
    plan = setup.kv_plan
    token_bytes = [b / plan.block_size for b in plan.block_bytes]
    return ModelTraffic.of_model(model, setup.model_config, token_bytes, setup.dtype,
                                 ranks=config.tensor_parallel_size)  # fmt: skip


def formats(traffic: ModelTraffic) -> set[str]:
    return {*traffic.layer_macs, *traffic.head_macs, *(traffic.expert_macs or {}),
            traffic.attention_format}  # fmt: skip


def cached_peaks_source(traffic: ModelTraffic, device_type: str) -> Callable[[], PeakRates | None]:
    """Reads this machine's measured peaks, without measuring; None until there are some.
    The peaks are a CPU's: a GPU engine's steps are not held against them (None always)."""

    def read() -> PeakRates | None:
        if device_type != "cpu":
            return None
        from inferd.plan.machine_peaks import MachinePeaks, load_cached

        data = load_cached()
        if data is None:
            return None
        peaks = MachinePeaks.from_dict(data)
        rates = dict(peaks.flops_s)
        rates.update({f: peaks.flops_for(f) for f in formats(traffic)})
        log.info("step efficiency: MBU and MFU against %s (measured %s)", peaks.name,
                 peaks.measured_at or "?")  # fmt: skip
        return PeakRates(peaks.name, peaks.memory_bandwidth_bytes_s, rates)

    return read

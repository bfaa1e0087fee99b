"""How close inferd's steps ran to this machine's limits during a benchmark: MBU and MFU of the
decode and prefill steps of the measured part (inferd/step_efficiency.py), for the report's
table, its step lines and the JSON document.

The peaks are measured once per machine (inferd/plan/machine_peaks.py: a few seconds, then
cached), by `ensure_peaks` after the model is loaded and before the engine runs a step: the
engine itself only reads the cache (engine/core/step_efficiency_meter.py).
"""

from __future__ import annotations

from typing import Any


def ensure_peaks(device: str, say) -> None:
    """Measure this machine's peaks now unless they are cached (CPU engines only: a GPU's steps
    are not held against them). `say`: prints a line."""
    if not device.startswith("cpu"):
        return
    from inferd.plan.machine_peaks import load_cached, machine_peaks

    if load_cached() is None:
        say("measuring this machine's read bandwidth and matrix throughput once (a few "
            "seconds; kept in the cache) for MBU / MFU…")  # fmt: skip
    machine_peaks()


def efficiency_dict(efficiency: Any) -> dict | None:
    """A StepEfficiency for the JSON document: per kind of step, totals, rates, MBU, MFU."""
    if efficiency is None:
        return None
    peaks = efficiency.peaks
    return {
        **{kind: k.to_dict() for kind, k in efficiency.kinds.items() if k.steps},
        "peaks": None if peaks is None else {
            "machine": peaks.machine,
            "memory_bandwidth_bytes_s": peaks.memory_bandwidth_bytes_s,
            "flops_s": peaks.flops_s,
        },
    }  # fmt: skip


def utilization(result: Any, kind: str, which: str) -> float | None:
    """The result's time-weighted MBU or MFU (`which`) of one kind of step, in percent."""
    efficiency = getattr(result, "step_efficiency", None)
    if efficiency is None or not efficiency.kinds[kind].steps:
        return None
    k = efficiency.kinds[kind]
    value = k.mean_mbu if which == "mbu" else k.mean_mfu
    return None if value is None else 100.0 * value


TABLE_ROWS = [
    ("Decode MBU (%)", lambda r: utilization(r, "decode", "mbu")),
    ("Decode MFU (%)", lambda r: utilization(r, "decode", "mfu")),
    ("Prefill MBU (%)", lambda r: utilization(r, "prefill", "mbu")),
    ("Prefill MFU (%)", lambda r: utilization(r, "prefill", "mfu")),
]


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def efficiency_lines(result: Any) -> list[str]:
    """Per kind of step: what a step read and computed, the rates it reached, MBU and MFU, and
    which limit it ran nearer; or why MBU and MFU are unknown."""
    efficiency = getattr(result, "step_efficiency", None)
    if efficiency is None:
        return []
    lines = []
    for kind, k in efficiency.kinds.items():
        if not k.steps:
            continue
        line = (
            f"{result.system} {kind} steps: {_si((k.weight_bytes + k.kv_bytes) / k.steps, 'B')} "
            f"read a step ({_si(k.kv_bytes / k.steps, 'B')} of it KV), "
            f"{_si(k.flops / k.steps, 'FLOP')}; {_si(k.bytes_per_s or 0, 'B/s')}, "
            f"{_si(k.flops / k.seconds, 'FLOP/s')}"
        )
        if k.mean_mbu is None:
            line += "; MBU / MFU unknown (this machine's peaks are not measured)"
        else:
            line += (f" = MBU {k.mean_mbu:.1%}, MFU {k.mean_mfu:.1%} of the peaks: nearer the "
                     f"{k.bound} limit")  # fmt: skip
        lines.append(line)
    if efficiency.peaks is not None and lines:
        p = efficiency.peaks
        lines.append(f"peaks: {p.machine}, read bandwidth {_si(p.memory_bandwidth_bytes_s, 'B/s')}")
    return lines

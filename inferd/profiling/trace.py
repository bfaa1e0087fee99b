"""A `torch.profiler` trace of one engine's steps, from `start()` to `stop()`:

    DIR/inferd-<pid>-<time>.trace.json   Chrome trace format: open it in https://ui.perfetto.dev
                                         or chrome://tracing
    DIR/inferd-<pid>-<time>.ops.txt      the profiler's table of the top ops and ranges

CPU activity always, CUDA kernels too when the engine runs on a CUDA device. Besides torch's
own ops the trace holds inferd's named ranges (instrument.py): `inferd.step` and its phases
(`inferd.schedule`, `inferd.prepare`, `inferd.forward`, `inferd.sample`, `inferd.output`),
`layer.N`, `lm_head`, and the C kernels by name. Nothing here exists until a trace starts.

A trace grows with every step it records; after `max_steps` the engine ends it by itself (the
files are written then, and the next stop returns them), so one forgotten trace cannot fill
the memory of a long-running server.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from inferd.engine_client import TraceFiles
from inferd.profiling.instrument import EngineRanges, instrument_model, record_function
from inferd.profiling.step_timer import StepTimer

log = logging.getLogger(__name__)

DEFAULT_MAX_STEPS = 5000
TABLE_ROWS = 40


def trace_directory(directory: str | os.PathLike) -> Path:
    """The directory traces go to, created if needed; ValueError when it cannot be written."""
    path = Path(directory).expanduser().resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"profiler directory {str(path)!r} cannot be created: {e}") from e
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"profiler directory {str(path)!r} is not writable")
    return path


class TraceSession:
    def __init__(self, directory: str | os.PathLike, timer: StepTimer, runner: Any,
                 device: torch.device, max_steps: int | None = None):  # fmt: skip
        self.directory = trace_directory(directory)
        self.timer, self.runner = timer, runner
        self.max_steps = max_steps or DEFAULT_MAX_STEPS
        self.cuda = torch.device(device).type == "cuda"
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(activities=activities)
        self.steps = 0
        self._patches = None

    def start(self) -> None:
        self.profiler.start()
        record = record_function()
        try:
            self._patches = instrument_model(self.runner, record)
        except BaseException:
            self.profiler.stop()
            raise
        self.timer.ranges = EngineRanges(record)

    def count_step(self) -> bool:
        """Called after each recorded step; True once the trace holds `max_steps` steps."""
        self.steps += 1
        return self.steps >= self.max_steps

    def stop(self) -> TraceFiles:
        """End the trace and write its files (seconds for a long trace)."""
        ranges, self.timer.ranges = self.timer.ranges, None
        if ranges is not None:
            ranges.end_step()
        if self._patches is not None:
            self._patches.restore()
        self.profiler.stop()
        millis = int(time.time() * 1000)
        stem = f"inferd-{os.getpid()}-{time.strftime('%Y%m%d-%H%M%S')}-{millis % 1000:03d}"
        trace = self.directory / f"{stem}.trace.json"
        self.profiler.export_chrome_trace(str(trace))
        sort = "self_device_time_total" if self.cuda else "self_cpu_time_total"
        table = self.profiler.key_averages().table(sort_by=sort, row_limit=TABLE_ROWS)
        ops = self.directory / f"{stem}.ops.txt"
        ops.write_text(f"{self.steps} engine steps; sorted by {sort}\n{table}\n")
        log.info("trace of %d steps written to %s (top ops: %s)", self.steps, trace, ops)
        return TraceFiles(str(trace), str(ops), self.steps, table)

"""Rank 0's runner under tensor parallelism: before running a step on its own shard it sends
the step to every worker (`tp_workers.py`), so all ranks enter the same collectives. A worker
that died or hung turns into `WorkerFailure` (the collectives time out or lose their peer): the
engine then fails every request and reports itself dead, instead of waiting forever."""

from __future__ import annotations

import atexit
import logging
import time

import torch

from inferd.distributed.control import broadcast, gather_reports
from inferd.distributed.launch import leave_group
from inferd.distributed.state import TPGroup
from inferd.engine.execution.device_state import SequenceStep
from inferd.engine.execution.runner import ModelRunner
from inferd.engine.execution.tp_workers import rank_report
from inferd.engine.scheduling.step import StepRecord
from inferd.errors import EngineDeadError

log = logging.getLogger(__name__)


class WorkerFailure(EngineDeadError):
    """A tensor-parallel rank is gone: the engine cannot run another step."""


class TPModelRunner:
    def __init__(self, local: ModelRunner, tp: TPGroup, control, procs: list):
        self.local, self.tp, self.control, self.procs = local, tp, control, procs
        self._stopped = False
        atexit.register(self.shutdown)  # reap the workers however the engine ends

    def __getattr__(self, name: str):
        return getattr(self.local, name)  # model, kv_caches, block_size, graphs, ...

    def _check_workers(self) -> None:
        dead = [p for p in self.procs if not p.is_alive()]
        if dead:
            codes = ", ".join(f"{p.name} (exit code {p.exitcode})" for p in dead)
            raise WorkerFailure(f"tensor-parallel worker exited: {codes}")

    def _send(self, message) -> None:
        self._check_workers()
        try:
            broadcast(message, self.control)
        except RuntimeError as e:
            raise WorkerFailure(f"tensor-parallel worker unreachable: {e}") from e

    def execute_step(self, record: StepRecord, timer=None):
        """Every worker gets the record (its deltas, block clears and copies: one message a
        step), then all ranks run it; only rank 0 samples."""
        self._send(("step", record.for_workers()))
        return self._guarded(self.local.execute_step, record, timer)

    def execute_with_prompt_logits(self, steps: list[SequenceStep], timer=None):
        self._send(("rows", steps))
        return self._guarded(self.local.execute_with_prompt_logits, steps, timer)

    def execute(self, steps: list[SequenceStep]) -> torch.Tensor:
        return self.execute_with_prompt_logits(steps)[0]

    def clear_blocks(self, blocks: list[list[int]]) -> None:
        """Zero blocks on every rank now (direct runner use; steps carry their own clears)."""
        if any(blocks):
            self._send(("clear", blocks))
        self.local.clear_blocks(blocks)

    def _guarded(self, run, *args):
        try:
            return run(*args)
        except RuntimeError as e:  # a collective lost its peer or timed out
            self._check_workers()
            raise WorkerFailure(f"tensor-parallel step failed: {e}") from e

    def reports(self) -> list[dict]:
        """Per rank: pid, bytes of weights and of KV cache it holds (measured on each rank)."""
        self._send(("report",))
        return gather_reports(rank_report(self.local.model, self.local), self.control)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the workers (politely, then by force) and leave the process group."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if all(p.is_alive() for p in self.procs):
                broadcast(("stop",), self.control)
        except RuntimeError:
            log.warning("could not tell the workers to stop; terminating them")
        deadline = time.monotonic() + timeout
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(5)
        self.control = None  # leave_group joins the group's threads once nothing refers to it
        leave_group(self.tp)

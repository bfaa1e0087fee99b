"""A whole plan: the model on the hardware under the workload, every candidate configuration
predicted, the best one chosen, and the capacity checklist answered from it.

The best candidate is the one that serves the most output tokens per second at the largest
concurrency meeting the SLOs (per device-hour: cost follows). A model that fits no candidate,
or SLOs no candidate meets, raise `PlanError` saying by how much / the best reachable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferd.plan.candidates import (
    Candidate,
    build_candidate,
    layouts_for,
    precisions_for,
)
from inferd.plan.interconnects import Interconnect, interconnect
from inferd.plan.machine_peaks import MachinePeaks
from inferd.plan.model_facts import ModelFacts
from inferd.plan.predict import (
    Economics,
    Operating,
    Workload,
    concurrency_for_rate,
    economics,
    largest_meeting,
    operate,
)
from inferd.plan.step_model import StepModel

GIB = 2**30


class PlanError(ValueError):
    """Bad input, or a plan with no answer: the message says why and what is reachable."""


@dataclass(frozen=True)
class Hardware:
    name: str
    description: str
    kind: str  # "cpu" or "gpu"
    peaks: MachinePeaks
    model: StepModel
    devices: int
    link: Interconnect
    tdp_w: float
    price_per_hour: float | None  # per device
    source: str
    this_machine: bool = False


@dataclass(frozen=True)
class Evaluated:
    candidate: Candidate
    at_workload: Operating | None  # at the workload's concurrency (None: it does not fit)
    best_under_slo: Operating | None  # the largest concurrency meeting the SLOs
    economics: Economics | None
    keeps_up: bool = True  # with --rate: whether it sustains the rate


@dataclass
class Plan:
    facts: ModelFacts
    hardware: Hardware
    workload: Workload
    evaluated: list[Evaluated] = field(default_factory=list)
    rejected: list[tuple[Candidate, str]] = field(default_factory=list)

    @property
    def best(self) -> Evaluated:
        meeting = [e for e in self.evaluated if e.best_under_slo is not None]
        if not meeting:
            raise PlanError("no configuration meets the SLOs")

        def score(e: Evaluated) -> tuple:
            op = e.best_under_slo
            assert op is not None
            return (e.keeps_up, op.output_tok_s)

        return max(meeting, key=score)


def make_plan(facts: ModelFacts, hardware: Hardware, workload: Workload,
              precisions: list[str] | None = None, block_kernels: bool = False,
              kv_cache_dtype: str = "auto") -> Plan:  # fmt: skip
    plan = Plan(facts, hardware, workload)
    device = "cpu" if hardware.kind == "cpu" else "cuda"
    flops = hardware.peaks.flops_s
    wanted = precisions_for(hardware.kind, flops, facts, hardware.this_machine, block_kernels)
    if precisions:
        unknown = [p for p in precisions if p not in wanted]
        if unknown:
            raise PlanError(f"--precision {', '.join(unknown)}: {hardware.name} runs "
                            f"{', '.join(wanted)}")  # fmt: skip
        wanted = precisions
    concurrency = workload.concurrency or 1
    for layout in layouts_for(facts, hardware.devices):
        for precision in wanted:
            c = build_candidate(
                facts, precision, layout, device=device, capacity=hardware.peaks.memory_bytes,
                context=workload.context, concurrency=concurrency, peaks_flops=flops,
                max_num_batched_tokens=workload.max_num_batched_tokens,
                kv_cache_dtype=kv_cache_dtype,
            )  # fmt: skip
            if c.max_concurrency < 1:
                over = c.memory.weights + c.memory.activations + c.memory.runtime
                over += c.kv_bytes_per_request - c.memory.capacity
                plan.rejected.append((c, f"short of {over / GIB:.1f} GiB for one request"))
                continue
            _evaluate(plan, c, workload, hardware)
    if not plan.evaluated:
        raise PlanError(_fits_nowhere(plan))
    return plan


def _evaluate(plan: Plan, c: Candidate, w: Workload, hw: Hardware) -> None:
    keeps_up = True
    n = w.concurrency or 1
    if w.rate is not None:
        n, keeps_up = concurrency_for_rate(c, hw.model, w, hw.link, hw.kind)
    per_replica = -(-n // c.layout.dp) if w.rate is None else n
    at = None
    if per_replica <= c.max_concurrency:
        at = operate(c, hw.model, w, per_replica, hw.link, hw.kind)
    if w.ttft_p99_s is None and w.tpot_p99_s is None:
        best = at  # no SLO: the workload's own concurrency is the operating point
    else:
        best = largest_meeting(c, hw.model, w, hw.link, hw.kind)
    op = best or at
    econ = None
    if op is not None:
        econ = economics(op, c.layout.devices, hw.tdp_w, hw.price_per_hour)
    plan.evaluated.append(Evaluated(c, at, best, econ, keeps_up))


def _fits_nowhere(plan: Plan) -> str:
    closest = min(plan.rejected, key=lambda r: r[0].memory.total - r[0].memory.capacity)
    c = closest[0]
    need = c.memory.weights + c.memory.activations + c.memory.runtime + c.kv_bytes_per_request
    return (f"{plan.facts.name} fits no configuration of {plan.hardware.devices} x "
            f"{plan.hardware.description} ({c.memory.capacity / GIB:.1f} GiB each): the closest, "
            f"{c.name}, needs {need / GIB:.1f} GiB a device for one request of "
            f"{plan.workload.context} tokens, {(need - c.memory.capacity) / GIB:.1f} GiB more "
            "than a device holds; use more devices (--devices), a smaller precision, or a "
            "shorter context")  # fmt: skip


def slo_failure(plan: Plan) -> str:
    """What the best configuration reaches at one sequence, when none meets the SLOs."""
    ops = [(e, operate(e.candidate, plan.hardware.model, plan.workload, 1, plan.hardware.link,
                       plan.hardware.kind)) for e in plan.evaluated]  # fmt: skip
    best_ttft = min(ops, key=lambda x: x[1].ttft_s)
    best_tpot = min(ops, key=lambda x: x[1].tpot_p99_s)
    w = plan.workload
    asked = []
    if w.ttft_p99_s is not None:
        asked.append(f"TTFT p99 <= {w.ttft_p99_s * 1e3:g} ms")
    if w.tpot_p99_s is not None:
        asked.append(f"TPOT p99 <= {w.tpot_p99_s * 1e3:g} ms")
    return (f"no configuration meets {' and '.join(asked)}: the best reachable, at one "
            f"sequence, is TTFT {best_ttft[1].ttft_s * 1e3:.1f} ms ({best_ttft[0].candidate.name}) "
            f"and TPOT p99 {best_tpot[1].tpot_p99_s * 1e3:.2f} ms "
            f"({best_tpot[0].candidate.name})")  # fmt: skip


def link_for(name: str | None, default: str, devices: int) -> Interconnect:
    link = interconnect(name or default)
    return link if devices > 1 or name else interconnect(default)

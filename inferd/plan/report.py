"""A plan as text (rich tables) and as JSON, with the capacity checklist answered line by line:

1. model size, quantised (the weights at the chosen precision)
2. weights + KV per request at the maximum context
3. target concurrency at the p99 latency budget
4. parallelism strategy (TP / PP / EP / DP)
5. interconnect (the all-reduce's share of a step)
6. power and cooling (watts at TDP, heat, tokens per joule)
7. software SLA (the SLOs, met or not, with their headroom)
"""

from __future__ import annotations

from inferd.memory.kv import kv_bytes_for_context
from inferd.plan.planner import Evaluated, Plan
from inferd.plan.predict import Operating

GIB = 2**30


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.1f} ms" if s >= 0.01 else f"{s * 1e3:.2f} ms"


def op_dict(op: Operating | None) -> dict | None:
    if op is None:
        return None
    return {
        "concurrency_per_replica": op.concurrency,
        "ttft_s": op.ttft_s,
        "tpot_s": op.tpot_s,
        "tpot_p99_s": op.tpot_p99_s,
        "output_tok_s": op.output_tok_s,
        "decode_step": {"time_s": op.decode.time_s, "memory_s": op.decode.memory_s,
                        "compute_s": op.decode.compute_s, "overhead_s": op.decode.overhead_s,
                        "all_reduce_s": op.decode.communication_s, "bound": op.decode.bound,
                        "why": op.decode.why()},
        "prefill_chunk": {"time_s": op.prefill.time_s, "memory_s": op.prefill.memory_s,
                          "compute_s": op.prefill.compute_s, "bound": op.prefill.bound,
                          "why": op.prefill.why()},
    }  # fmt: skip


def evaluated_dict(e: Evaluated) -> dict:
    c = e.candidate
    return {
        "name": c.name,
        "precision": c.precision,
        "tp": c.layout.tp, "pp": c.layout.pp, "ep": c.layout.ep, "dp": c.layout.dp,
        "memory_per_device": {"weights": c.memory.weights, "kv_cache": c.memory.kv_cache,
                              "activations": c.memory.activations, "runtime": c.memory.runtime,
                              "total": c.memory.total, "capacity": c.memory.capacity},
        "kv_bytes_per_request": c.kv_bytes_per_request,
        "max_concurrency_in_memory": c.max_concurrency,
        "at_workload": op_dict(e.at_workload),
        "best_under_slo": op_dict(e.best_under_slo),
        "keeps_up_with_rate": e.keeps_up,
        "power_w": e.economics.power_w if e.economics else None,
        "tokens_per_joule": e.economics.tokens_per_joule if e.economics else None,
        "cost_per_million_tokens": e.economics.cost_per_million_tokens if e.economics else None,
    }  # fmt: skip


def checklist(plan: Plan) -> list[tuple[str, str]]:
    """The seeds' capacity checklist, each line answered for the best configuration."""
    w, hw = plan.workload, plan.hardware
    try:
        best = plan.best
    except ValueError:
        best = max(plan.evaluated, key=lambda e: e.candidate.max_concurrency)
    c = best.candidate
    op = best.best_under_slo or best.at_workload
    config = plan.facts.config
    max_ctx = config.max_position_embeddings
    kv_max = kv_bytes_for_context(c.slice.shard, max_ctx, c.slice.kv_element) // c.layout.pp
    lines = [
        ("model size, quantised",
         f"{plan.facts.params / 1e9:.2f} B parameters; {c.precision} weights "
         f"{_gib(c.estimate.per_device.weights * c.layout.tp)} in all, "
         f"{_gib(c.memory.weights)} a device"),
        ("weights + KV per request at max context",
         f"KV {_gib(c.kv_bytes_per_request)} a request at {w.context} tokens, "
         f"{_gib(kv_max)} at the model's {max_ctx}; weights {_gib(c.memory.weights)} + "
         f"activations {_gib(c.memory.activations)} + runtime {_gib(c.memory.runtime)} a device"),
    ]  # fmt: skip
    if best.best_under_slo is not None:
        b = best.best_under_slo
        what = ("target concurrency at the p99 latency budget" if w.ttft_p99_s or w.tpot_p99_s
                else "concurrency (no SLO given: the workload's)")  # fmt: skip
        lines.append((what, f"{b.concurrency * c.layout.dp} sequences ({b.concurrency} a replica): "
                      f"TTFT {_ms(b.ttft_s)}, TPOT p99 {_ms(b.tpot_p99_s)}, "
                      f"{b.output_tok_s:,.0f} output tok/s"))  # fmt: skip
    else:
        lines.append(("target concurrency at the p99 latency budget", "no concurrency meets it"))
    ar = op.all_reduce_s if op else 0.0
    share = ar / op.decode.time_s if op and op.decode.time_s else 0.0
    lines += [
        ("parallelism strategy",
         f"{c.layout.label()} on {c.layout.devices} device(s)"
         + (" (experts spread over the TP ranks)" if c.layout.ep > 1 else "")
         + f"; {len(plan.evaluated)} configurations fit, {len(plan.rejected)} do not"),
        ("interconnect",
         f"{hw.link.description}: all-reduces {_ms(ar)} of a {_ms(op.decode.time_s if op else 0)}"
         f" decode step ({share:.0%})" if c.layout.tp > 1 else
         f"{hw.link.description}: no tensor-parallel all-reduce at TP=1"),
    ]  # fmt: skip
    if hw.tdp_w <= 0:
        lines.append(("power and cooling", "give --tdp (watts a device) for power, heat and "
                      "tokens per joule"))  # fmt: skip
    elif best.economics is not None:
        e = best.economics
        cost = ("" if e.cost_per_million_tokens is None else
                f"; ${e.cost_per_million_tokens:.3f} per million output tokens")  # fmt: skip
        lines.append(("power and cooling",
                      f"{e.power_w:,.0f} W at {hw.tdp_w:g} W TDP a device, "
                      f"{e.heat_btu_h:,.0f} BTU/h to remove; "
                      f"{e.tokens_per_joule:.2f} output tokens per joule{cost}"))  # fmt: skip
    sla = []
    op = best.at_workload or op  # the SLA is the workload's: its concurrency, or its rate's
    if w.rate is not None and best.at_workload is not None:
        keeps = "keeps up" if best.keeps_up else "does not keep up"
        sla.append(f"{w.rate:g} requests/s need {best.at_workload.concurrency} running a "
                   f"replica ({keeps})")  # fmt: skip
    if w.ttft_p99_s is not None and op is not None:
        sla.append(f"TTFT p99 {_ms(op.ttft_s)} against {_ms(w.ttft_p99_s)}")
    if w.tpot_p99_s is not None and op is not None:
        sla.append(f"TPOT p99 {_ms(op.tpot_p99_s)} against {_ms(w.tpot_p99_s)}")
    lines.append(("software SLA", "; ".join(sla) if sla else
                  "no SLO given (--ttft-p99, --tpot-p99)"))  # fmt: skip
    return lines


def plan_dict(plan: Plan) -> dict:
    w, hw = plan.workload, plan.hardware
    try:
        best = plan.best.candidate.name
    except ValueError:
        best = None
    return {
        "model": {"name": plan.facts.name, "source": plan.facts.source,
                  "params": plan.facts.params},
        "hardware": {"name": hw.name, "description": hw.description, "kind": hw.kind,
                     "devices": hw.devices, "memory_bytes": hw.peaks.memory_bytes,
                     "memory_bandwidth_bytes_s": hw.peaks.memory_bandwidth_bytes_s,
                     "flops_s": hw.peaks.flops_s, "interconnect": hw.link.name,
                     "tdp_w": hw.tdp_w, "price_per_hour": hw.price_per_hour,
                     "source": hw.source,
                     "step_overhead": hw.model.overhead.source},
        "workload": {"prompt_len": w.prompt_len, "output_len": w.output_len,
                     "concurrency": w.concurrency, "rate": w.rate,
                     "ttft_p99_s": w.ttft_p99_s, "tpot_p99_s": w.tpot_p99_s},
        "candidates": [evaluated_dict(e) for e in plan.evaluated],
        "not_fitting": [{"name": c.name, "why": why} for c, why in plan.rejected],
        "best": best,
        "checklist": [{"item": k, "answer": v} for k, v in checklist(plan)],
    }  # fmt: skip


def render(console, plan: Plan) -> None:
    from rich.table import Table

    w, hw = plan.workload, plan.hardware
    console.print(f"[bold]{plan.facts.name}[/bold] ({plan.facts.params / 1e9:.2f} B parameters; "
                  f"{plan.facts.source})")  # fmt: skip
    console.print(f"hardware: {hw.devices} x {hw.description}, "
                  f"{hw.peaks.memory_bandwidth_bytes_s / 1e9:,.1f} GB/s, "
                  f"{_gib(hw.peaks.memory_bytes)} each; link {hw.link.description}; "
                  f"{hw.source}")  # fmt: skip
    console.print(f"step model: {hw.model.bandwidth_fraction:.0%} of the bandwidth, "
                  f"{hw.model.compute_fraction:.0%} of the matrix throughput; overhead "
                  f"{hw.model.overhead.source}")  # fmt: skip
    load = f"{w.concurrency} concurrent" if w.rate is None else f"{w.rate:g} requests/s"
    console.print(f"workload: prompt {w.prompt_len} + output {w.output_len} tokens, {load}; "
                  f"SLOs TTFT p99 {_ms(w.ttft_p99_s)}, TPOT p99 {_ms(w.tpot_p99_s)}")  # fmt: skip
    mem = Table(title="memory per device (inferd.memory's estimate)")
    for col in ("configuration", "weights", "KV", "activations", "runtime", "total",
                "max concurrency"):  # fmt: skip
        mem.add_column(col, justify="left" if col == "configuration" else "right")
    for e in plan.evaluated:
        m = e.candidate.memory
        mem.add_row(e.candidate.name, _gib(m.weights), _gib(m.kv_cache), _gib(m.activations),
                    _gib(m.runtime), _gib(m.total),
                    str(e.candidate.max_concurrency * e.candidate.layout.dp))  # fmt: skip
    console.print(mem)
    perf = Table(title="roofline and latency (at the workload; then the largest concurrency "
                 "meeting the SLOs)")  # fmt: skip
    for col in ("configuration", "decode step", "bound", "prefill chunk", "bound", "TTFT",
                "TPOT", "TPOT p99", "tok/s", "SLO max conc.", "tok/s at it", "tok/J",
                "$/M tok"):  # fmt: skip
        perf.add_column(col, justify="left" if col == "configuration" else "right")
    for e in plan.evaluated:
        op, b = e.at_workload, e.best_under_slo
        econ = e.economics
        perf.add_row(
            e.candidate.name,
            _ms(op.decode.time_s) if op else "-", op.decode.bound if op else "-",
            _ms(op.prefill.time_s) if op else "-", op.prefill.bound if op else "-",
            _ms(op.ttft_s) if op else "-", _ms(op.tpot_s) if op else "-",
            _ms(op.tpot_p99_s) if op else "-", f"{op.output_tok_s:,.0f}" if op else "-",
            str(b.concurrency * e.candidate.layout.dp) if b else "none",
            f"{b.output_tok_s:,.0f}" if b else "-",
            f"{econ.tokens_per_joule:.2f}" if econ else "-",
            f"{econ.cost_per_million_tokens:.3f}" if econ and econ.cost_per_million_tokens
            is not None else "-",
        )  # fmt: skip
    console.print(perf)
    for c, why in plan.rejected:
        console.print(f"does not fit: {c.name}: {why}")
    try:
        best = plan.best
        op = best.best_under_slo
        assert op is not None
        console.print(f"[bold]best[/bold]: {best.candidate.name}; decode step "
                      f"{op.decode.why()}; prefill chunk {op.prefill.why()}")  # fmt: skip
    except ValueError:
        pass
    checks = Table(title="capacity checklist")
    checks.add_column("item")
    checks.add_column("answer")
    for item, answer in checklist(plan):
        checks.add_row(item, answer)
    console.print(checks)

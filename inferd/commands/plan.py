"""`inferd plan`: how fast a model runs on given hardware, how many users at what latency, with
which precision and parallelism, at what power and cost; `--check` runs the engine on this
machine and prints its predictions against what it measures (docs/capacity.md).

The logic is inferd/plan/; this module reads the flags and prints.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

_DURATION = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|us)?\s*")


def parse_duration(text: str) -> float:
    """'200ms', '0.2s', '0.2' (seconds), '500us' → seconds."""
    m = _DURATION.fullmatch(text)
    if not m:
        raise argparse.ArgumentTypeError(f"a duration like 200ms or 1.5s (got {text!r})")
    return float(m.group(1)) * {"ms": 1e-3, "us": 1e-6, "s": 1.0, None: 1.0}[m.group(2)]


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from e
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive (got {text!r})")
        return value

    parse.__name__ = kind.__name__
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # fmt: off
    parser.add_argument("model_pos", nargs="?", metavar="MODEL",
                        help="GGUF file, HF folder or catalog name (default: the embedded "
                        "Gemma 3 270M)")
    parser.add_argument("--model", help="same as MODEL (default: the embedded model)")
    parser.add_argument("--arch", help="plan for a published shape instead of a file: llama, "
                        "qwen2 or mistral, with --params (default: none)")
    parser.add_argument("--params", help="parameter count with --arch, e.g. 7B, 70B, 1.5B "
                        "(default: none)")
    parser.add_argument("--hardware", default="this",
                        help="'this' (this machine, measured once and cached) or a named "
                        "profile: h100-sxm, h100-pcie, h200, a100-40gb, a100-80gb, l40s, "
                        "rtx-4090, rtx-4060-laptop, epyc-ddr5, xeon-ddr5")
    parser.add_argument("--devices", type=_positive(int), default=1,
                        help="devices of that hardware to spread the model over")
    parser.add_argument("--interconnect",
                        help="link between the devices: nvlink4, nvlink3, pcie5, pcie4, ib-ndr, "
                        "ib-hdr, roce-400g, roce-100g (default: the profile's)")
    parser.add_argument("--precision",
                        help="comma-separated weight precisions to weigh (default: all the "
                        "hardware runs: gguf (a GGUF file's own blocks), fp32, bf16 on this "
                        "machine; bf16, fp8, int8, int4 on a GPU)")
    parser.add_argument("--kv-cache-dtype", default="auto",
                        help="auto (the compute dtype), float32, bfloat16, float16, fp8, int8")
    parser.add_argument("--prompt-len", type=_positive(int), default=512,
                        help="prompt tokens of a request")
    parser.add_argument("--output-len", type=_positive(int), default=128,
                        help="output tokens of a request")
    parser.add_argument("--concurrency", type=_positive(int),
                        help="requests running at once (default: 8, unless --rate)")
    parser.add_argument("--rate", type=_positive(float),
                        help="arrival rate in requests per second, instead of --concurrency "
                        "(default: none)")
    parser.add_argument("--ttft-p99", type=parse_duration,
                        help="SLO on time to first token, e.g. 500ms (default: none)")
    parser.add_argument("--tpot-p99", type=parse_duration,
                        help="SLO on time per output token, e.g. 50ms (default: none)")
    parser.add_argument("--max-num-batched-tokens", type=_positive(int),
                        help="token budget of a step (default: the engine's: 1024 on a CPU, "
                        "8192 on a GPU)")
    parser.add_argument("--price-per-hour", type=_positive(float),
                        help="price of one device-hour in dollars, for cost per million "
                        "tokens (default: none)")
    parser.add_argument("--tdp", type=_positive(float),
                        help="power of one device in watts (default: the profile's; none for "
                        "this machine)")
    parser.add_argument("--plot", metavar="PNG",
                        help="also draw throughput and latency against concurrency with the "
                        "SLO lines; needs matplotlib (default: no plot)")
    parser.add_argument("--json", action="store_true", help="print JSON, not tables")
    parser.add_argument("--check", action="store_true",
                        help="run the engine on this machine at batches of 1, 8 and 32 and a "
                        "512-token prefill, and print predicted against measured; with a named "
                        "--hardware, the predictions alone")
    parser.add_argument("--output-len-check", type=_positive(int), default=16,
                        help="tokens generated at each --check point")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="what --check measures: wall-clock time, or the process's CPU "
                        "time over its threads (for cores shared with other work)")
    parser.add_argument("--measure-again", action="store_true",
                        help="measure this machine's peaks and fit its step model anew "
                        "(a quiet machine gives the figures to keep)")
    # fmt: on


def _this_machine(refresh: bool):
    from inferd.cpu_kernels import kernels_available
    from inferd.llm import LLM
    from inferd.plan.candidates import default_mode_slice
    from inferd.plan.machine_peaks import machine_peaks
    from inferd.plan.step_model import this_machine_step_model

    peaks = machine_peaks(refresh=refresh)
    model = this_machine_step_model(
        peaks, make_llm=LLM, refresh=refresh,
        slice_for=lambda facts: default_mode_slice(facts, peaks, kernels_available()),
    )  # fmt: skip
    return peaks, model, kernels_available()


def _hardware(args, kind_hint: str | None = None):
    from inferd.plan.hardware_profiles import profile
    from inferd.plan.interconnects import interconnect
    from inferd.plan.planner import Hardware
    from inferd.plan.step_model import profile_step_model

    if args.hardware.strip().lower() == "this":
        peaks, model, block_kernels = _this_machine(args.measure_again)
        link = interconnect(args.interconnect or "memory")
        if args.devices > 1:
            raise ValueError("--hardware this is one machine: --devices must be 1")
        measured = f"measured {peaks.measured_at}"
        hw = Hardware("this", peaks.name, "cpu", peaks, model, 1, link, args.tdp or 0.0,
                      args.price_per_hour, measured, this_machine=True)  # fmt: skip
        return hw, block_kernels
    p = profile(args.hardware)
    link = interconnect(args.interconnect or p.interconnect)
    hw = Hardware(p.name, p.description, p.kind, p.peaks(), profile_step_model(p.peaks()),
                  args.devices, link, args.tdp or p.tdp_watts, args.price_per_hour,
                  p.source)  # fmt: skip
    return hw, False


def run(args: argparse.Namespace) -> int:
    from inferd.plan.model_facts import load_model
    from inferd.plan.planner import PlanError, make_plan, slo_failure
    from inferd.plan.predict import Workload

    if args.model and args.model_pos and args.model != args.model_pos:
        raise ValueError(f"two models given: {args.model_pos!r} and --model {args.model!r}")
    if args.rate is not None and args.concurrency is not None:
        raise ValueError("give --concurrency or --rate, not both")
    if args.plot:
        from inferd.bench.plots import pyplot

        pyplot()  # without matplotlib: say so before measuring anything
    _refuse_flags_that_do_not_apply(args)
    facts = load_model(args.model or args.model_pos, args.arch, args.params)
    if args.check:
        return _run_check(args, facts)
    hw, block_kernels = _hardware(args)
    budget = args.max_num_batched_tokens or (1024 if hw.kind == "cpu" else 8192)
    workload = Workload(args.prompt_len, args.output_len,
                        None if args.rate else (args.concurrency or 8), args.rate,
                        args.ttft_p99, args.tpot_p99, budget)  # fmt: skip
    precisions = args.precision.split(",") if args.precision else None
    plan = make_plan(facts, hw, workload, precisions, block_kernels, args.kv_cache_dtype)
    if not any(e.best_under_slo for e in plan.evaluated):
        raise PlanError(slo_failure(plan))
    if args.plot:
        from inferd.plan.plot import plot_plan

        plot_plan(args.plot, plan)
    if args.json:
        from inferd.plan.report import plan_dict

        json.dump(plan_dict(plan), sys.stdout, indent=2)
        print()
        return 0
    from rich.console import Console

    from inferd.plan.report import render

    render(Console(width=None if sys.stdout.isatty() else 160), plan)
    return 0


# flag → (attribute, its default): what a plan reads and --check does not, and the reverse
_PLAN_ONLY = {"--devices": ("devices", 1), "--interconnect": ("interconnect", None),
              "--precision": ("precision", None), "--kv-cache-dtype": ("kv_cache_dtype", "auto"),
              "--prompt-len": ("prompt_len", 512), "--output-len": ("output_len", 128),
              "--concurrency": ("concurrency", None), "--rate": ("rate", None),
              "--ttft-p99": ("ttft_p99", None), "--tpot-p99": ("tpot_p99", None),
              "--max-num-batched-tokens": ("max_num_batched_tokens", None),
              "--price-per-hour": ("price_per_hour", None), "--tdp": ("tdp", None),
              "--plot": ("plot", None)}  # fmt: skip
_CHECK_ONLY = {"--clock": ("clock", "wall"), "--output-len-check": ("output_len_check", 16)}


def _refuse_flags_that_do_not_apply(args: argparse.Namespace) -> None:
    """A flag the chosen mode would not read is refused by name, never ignored."""
    table, mode = (_PLAN_ONLY, "--check") if args.check else (_CHECK_ONLY, "a plan")
    given = [flag for flag, (attr, default) in table.items() if getattr(args, attr) != default]
    if given:
        raise ValueError(f"{', '.join(given)}: not read by {mode} (its points are fixed: "
                         "batches of 1, 8 and 32, a 512-token prefill)" if args.check else
                         f"{', '.join(given)}: only read by --check")  # fmt: skip


def _run_check(args: argparse.Namespace, facts) -> int:
    from inferd.plan.check import check_points, predicted_points, render_check

    if facts.format == "config" and args.hardware.strip().lower() == "this":
        raise ValueError("--check runs a model file: give a GGUF file, folder or name")
    if args.hardware.strip().lower() != "this":
        # predictions only, written down before a run on that hardware checks them
        hw, _ = _hardware(args)
        points = predicted_points(facts, hw, args.output_len_check)
        notes = [f"predictions only: this machine is not {hw.description} (bf16 weights, "
                 f"{hw.model.overhead.source})"]  # fmt: skip
        peaks = hw.peaks
    else:
        from inferd.cpu_kernels import kernels_available
        from inferd.llm import LLM
        from inferd.plan.candidates import default_mode_slice

        peaks, model, _ = _this_machine(args.measure_again)
        model_slice = default_mode_slice(facts, peaks, kernels_available())
        points, notes = check_points(facts, model_slice, model, LLM,
                                     output_len=args.output_len_check,
                                     clock=args.clock)  # fmt: skip
    if args.json:
        json.dump([p.to_dict() for p in points], sys.stdout, indent=2)
        print()
        return 0
    render_check(points, notes, peaks, facts)
    return 0

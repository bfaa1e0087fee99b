r"""`inferd bench throughput | latency | serve | startup`: measure inferd with vLLM's metric
definitions, and with `--compare llamacpp,hf` the peers on the same workload in the same run.

    inferd bench throughput --preset throughput32 --compare llamacpp
    inferd bench latency --preset single --compare llamacpp,hf --json out.json --plot out.png
    inferd bench serve --base-url http://127.0.0.1:8000 --request-rate 4 --num-prompts 64
    inferd bench startup --compare llamacpp
    inferd bench latency --preset copy --compare nospec --speculative-config \
        '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
          "prompt_lookup_min": 2}'

Tables go to stdout (stderr when `--json -` puts the JSON there); a peer that is not installed
is skipped with a message. Ratios are inferd / peer, measured minutes apart on the same machine.
`--compare nospec` is inferd without its --speculative-config, loaded beside it: the ratio is the
speed-up of speculative decoding.
"""

from __future__ import annotations

import argparse
import math
import time

from inferd.bench.presets import PRESETS
from inferd.commands.engine_args import (
    add_engine_arguments,
    engine_config_from_args,
    engine_flags_of,
)

DEFAULT_PROMPTS = dict(throughput=32, latency=1, serve=64)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):  # SamplingParams' own rule
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _percentiles(text: str) -> list[float]:
    try:
        values = [float(p) for p in text.split(",") if p.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected numbers like 50,90,99, got {text!r}") from e
    if not values or any(not 0 <= p <= 100 for p in values):
        raise argparse.ArgumentTypeError(f"percentiles must lie in [0, 100], got {text!r}")
    return values


def _workload_arguments(p: argparse.ArgumentParser, prompts_flag: str = "--num-prompts") -> None:
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="a standard workload, docs/benchmarks.md (default: none, the flags below)",
    )
    p.add_argument("--input-len", type=_positive_int, help="prompt tokens (default 128)")
    p.add_argument("--output-len", type=_positive_int, help="generated tokens (default 128)")
    p.add_argument(
        "--range-ratio",
        type=float,
        default=0.0,
        help="lengths uniform in [len·(1−r), len·(1+r)], 0 <= r < 1",
    )
    p.add_argument(prompts_flag, dest="num_prompts", type=_positive_int, default=None,
                   help="requests (default: the preset's, else throughput 32, latency 1, "
                        "serve 64)")  # fmt: skip
    p.add_argument("--percentiles", type=_percentiles, default=[50.0, 90.0, 99.0],
                   help="latency percentiles to report, e.g. 50,90,99")  # fmt: skip
    p.add_argument(
        "--json", metavar="PATH", help="write the results as JSON ('-': stdout) (default: no file)"
    )
    p.add_argument("--plot", metavar="PNG", help="plot throughput, throughput against "
                   "concurrency and the latency distributions; needs pip install "
                   "'inferd[plot]' (default: no plot)")  # fmt: skip


def _local_arguments(p: argparse.ArgumentParser) -> None:
    add_engine_arguments(p)  # its --seed seeds the workload too, as vLLM's benchmarks do
    p.add_argument("--compare", help="peers on the same workload: llamacpp, llama-bench "
                   "(llama.cpp's benchmark program, one sequence: bench latency with a batch of "
                   "one), hf, and nospec (inferd without --speculative-config) "
                   "(default: none)")  # fmt: skip
    p.add_argument("--llama-bench", metavar="PATH",
                   help="the llama-bench program for --compare llama-bench (default: "
                        "$INFERD_LLAMA_BENCH, else llama-bench on PATH)")  # fmt: skip
    p.add_argument("--hf-dtype", help="HF peer dtype (default: the dtype inferd runs in)")
    p.add_argument("--structured-outputs", metavar="JSON",
                   help="also run every request constrained by this spec (StructuredOutputsParams "
                        "as JSON, e.g. '{\"regex\": \"[a-z ]+\"}'), same engine, iterations "
                        "alternating: the ratio is constrained / free tokens/s (default: none; "
                        "--preset json sets a long JSON string)")  # fmt: skip
    p.add_argument("--profile", metavar="DIR",
                   help="write a torch.profiler trace of inferd's measured run to DIR (not "
                        "with --compare or --structured-outputs; default: none; "
                        "docs/profiling.md)")  # fmt: skip
    p.add_argument("--temperature", type=_temperature, default=0.0,
                   help="inferd samples at this temperature (unseeded) instead of decoding "
                        "greedily; the llamacpp and hf peers decode greedily only "
                        "(default 0)")  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="mode", metavar="MODE", required=True)
    p = sub.add_parser("throughput", help="offline: all requests at once")
    _workload_arguments(p)
    _local_arguments(p)
    p.add_argument(
        "--rounds",
        type=_positive_int,
        default=1,
        help="workload runs per system, fresh prompts each",
    )
    p = sub.add_parser("latency", help="one batch, repeated")
    _workload_arguments(p, "--batch-size")
    _local_arguments(p)
    p.add_argument("--num-iters-warmup", type=int, default=1, help="untimed batches first")
    p.add_argument("--num-iters", type=_positive_int, default=5, help="timed batches")
    p = sub.add_parser("serve", help="drive a running OpenAI-compatible server")
    _workload_arguments(p)
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server to measure")
    p.add_argument("--served-model-name", help="model name in requests (default: first listed)")
    p.add_argument("--tokenizer", help="model whose vocabulary the prompts use (default: embedded)")
    p.add_argument("--request-rate", type=float, default=math.inf, help="requests/s (inf: all)")
    p.add_argument(
        "--max-concurrency",
        type=_positive_int,
        default=None,
        help="most requests in flight (default: no limit)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the workload")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--profile", action="store_true",
                   help="trace the run on the server: /start_profile before, /stop_profile "
                        "after (the server needs --profiler-dir; vLLM's flag)")  # fmt: skip
    p = sub.add_parser("startup", help="process start → first token, fresh processes")
    add_engine_arguments(p)
    p.add_argument(
        "--num-runs",
        type=_positive_int,
        default=5,
        help="timed warm runs per system, after one untimed run fills the caches",
    )
    p.add_argument(
        "--cold-runs",
        type=int,
        default=1,
        help="runs each in a fresh, empty INFERD_CACHE (inferd only; 0: none)",
    )
    p.add_argument("--compare", help="peers: llamacpp (default: none)")
    p.add_argument(
        "--json", metavar="PATH", help="write the results as JSON ('-': stdout) (default: no file)"
    )


def workload_spec(args: argparse.Namespace):
    from inferd.bench.presets import resolve_workload

    return resolve_workload(
        args.preset,
        input_len=args.input_len,
        output_len=args.output_len,
        range_ratio=args.range_ratio,
        num_prompts=args.num_prompts,
        seed=args.seed,
        default_prompts=DEFAULT_PROMPTS[args.mode],
    )


def _console(args: argparse.Namespace):
    from rich.console import Console

    console = Console(stderr=getattr(args, "json", None) == "-", highlight=False)
    if not console.is_terminal:  # piped or logged: 80 columns would wrap the table
        console.width = 140
    return console


def run(args: argparse.Namespace) -> int:
    if args.mode == "startup":
        return _run_startup(args)
    if args.mode == "serve":
        return _run_serve(args)
    return _run_local(args)


def _run_local(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from inferd.bench import latency, report, throughput
    from inferd.bench.efficiency import ensure_peaks
    from inferd.bench.peers import parse_peers
    from inferd.bench.plots import plot_bench, pyplot
    from inferd.bench.systems import InferdSystem
    from inferd.bench.workload import workload_vocab

    console = _console(args)
    if args.plot:
        pyplot()  # without matplotlib: say so before measuring for minutes
    peer_names = parse_peers(args.compare)
    if args.profile:
        from inferd.profiling.trace import trace_directory

        if peer_names:  # one process-wide profiler would record the peers' work too
            raise ValueError("--profile traces inferd alone: drop --compare")
        trace_directory(args.profile)  # unwritable: fail before loading the model
    if "nospec" in peer_names and args.speculative_config is None:
        raise ValueError("--compare nospec needs --speculative-config (it measures its speed-up)")
    if args.temperature > 0 and set(peer_names) - {"nospec"}:
        raise ValueError("--temperature > 0: the llamacpp and hf peers decode greedily only")
    if "llama-bench" in peer_names and args.mode != "latency":
        raise ValueError("--compare llama-bench runs one sequence at a time: use it with "
                         "bench latency (--preset single or prefill512)")  # fmt: skip
    spec = workload_spec(args)
    if "llama-bench" in peer_names and spec.num_prompts != 1:
        raise ValueError(f"--compare llama-bench runs one sequence at a time, and the batch has "
                         f"{spec.num_prompts}: use --num-prompts 1")  # fmt: skip
    env_start = report.environment()
    structured = _structured_spec(args)
    if structured is not None and peer_names:
        raise ValueError("--structured-outputs compares inferd constrained and free; "
                         "leave out --compare")  # fmt: skip
    if structured is not None and args.profile:  # both runs share one engine, hence one trace
        raise ValueError("--profile traces one run: drop --structured-outputs (its constrained "
                         "and free runs share one engine)")  # fmt: skip
    inferd = InferdSystem(engine_config_from_args(args), temperature=args.temperature,
                          profile_dir=args.profile)  # fmt: skip
    ensure_peaks(inferd.info["device"], lambda line: console.print(f"[dim]{escape(line)}[/]"))
    vocab = workload_vocab(inferd.tokenizer)
    if args.mode == "latency":
        warm, batches = latency.latency_batches(
            spec, vocab, args.num_iters_warmup, args.num_iters, inferd.tokenizer
        )
        every = [r for b in warm + batches for r in b]
        title = (
            f"latency: batch {spec.num_prompts}, prompt {spec.input_len}, output "
            f"{spec.output_len} tokens, {args.num_iters} iterations after "
            f"{args.num_iters_warmup} warm-up, systems alternating"
        )
    else:
        rounds = throughput.round_workloads(spec, vocab, args.rounds, inferd.tokenizer)
        every = [r for requests in rounds for r in requests]
        title = (
            f"throughput: {spec.num_prompts} requests, prompts {spec.input_len}, outputs "
            f"{spec.output_len} tokens (seed {spec.seed}, EOS ignored), {args.rounds} round(s)"
        )
    if args.preset:
        title += f" [preset {args.preset}]"
    longest = max(r.prompt_len + r.output_len for r in every)
    systems, skipped = [inferd], []
    if structured is not None:
        from inferd.bench.constrained import ConstrainedSystem

        # Constrained first: the table's ratio column reads constrained / free.
        systems.insert(0, ConstrainedSystem(inferd, structured))
        title += f", constrained by {structured.kind} vs free"
    for name in peer_names:
        peer, why = _load_peer(name, inferd, args, n_ctx=max(512, longest + 16))
        if peer is None:
            console.print(f"[yellow]{escape(why)}[/]")
            skipped.append(why)
        else:
            systems.append(peer)
    loaded = ", ".join(f"{s.name} {s.load_seconds:.1f} s" for s in systems)
    console.print(f"[dim]loaded ({loaded}); measuring…[/]")
    t0 = time.perf_counter()
    if args.mode == "latency":
        results = latency.run_latency(systems, warm, batches, args.percentiles)
    else:
        results = throughput.run_throughput(systems, rounds, args.percentiles)
    console.print(f"[dim]measured in {time.perf_counter() - t0:.1f} s[/]")
    if inferd.trace is not None:
        console.print(f"  trace of {inferd.trace.steps} steps: {escape(inferd.trace.trace)}; "
                      f"top ops: {escape(inferd.trace.ops_table)}")  # fmt: skip
    for system in systems:
        system.close()
    env_end = report.environment()
    report.print_results(title, results, console, skipped)
    if structured is not None:
        console.print(f"  grammar cost: {systems[0].constraint_costs()}")
    console.print(
        f"  machine: {env_end['cpu_count']} CPUs, load average (1 min) "
        f"{_load(env_start)} at start → {_load(env_end)} at end"
    )
    if args.json:
        report.write_json(args.json, _document(args, spec, env_start, env_end, results, skipped))
    if args.plot:
        plot_bench(results, args.plot, title)
    return 0


def _structured_spec(args: argparse.Namespace):
    """The spec of --structured-outputs, else the preset's, else None."""
    from inferd.bench.constrained import parse_spec
    from inferd.structured_params import StructuredOutputsParams

    if args.structured_outputs:
        return parse_spec(args.structured_outputs)
    preset = PRESETS.get(args.preset or "", {})
    spec = preset.get("structured_outputs")
    return None if spec is None else StructuredOutputsParams.from_dict(spec)


def _load_peer(name: str, inferd, args: argparse.Namespace, n_ctx: int):
    """(peer, None), or (None, why) when it cannot run here."""
    from dataclasses import replace

    from inferd.bench.peers import PeerUnavailable, load_peer
    from inferd.bench.systems import InferdSystem

    if name == "nospec":
        config = replace(engine_config_from_args(args), speculative_config=None)
        return InferdSystem(config, "inferd, no speculation", args.temperature), None

    try:
        dtype = args.hf_dtype or inferd.info["dtype"]
        return load_peer(name, inferd.model_path, n_ctx=n_ctx, dtype=dtype, threads=args.threads,
                         device=inferd.info["device"],
                         llama_bench=args.llama_bench), None  # fmt: skip
    except PeerUnavailable as e:
        return None, str(e)


def _document(args, spec, env_start, env_end, results, skipped) -> dict:
    from inferd.bench.report import comparison_ratios

    return {
        "benchmark": args.mode,
        "preset": args.preset,
        "workload": spec.to_dict(),
        "settings": {
            k: v.to_dict() if hasattr(v, "to_dict") else v
            for k, v in vars(args).items()
            if not k.startswith("_")
        },  # fmt: skip
        "environment": {"start": env_start, "end": env_end},
        "results": [r.to_dict() for r in results],
        "ratios": comparison_ratios(results),
        "skipped": skipped,
    }


def _load(env: dict) -> str:
    return "n/a" if env["loadavg"] is None else f"{env['loadavg'][0]:.2f}"


def _run_serve(args: argparse.Namespace) -> int:
    from contextlib import nullcontext

    from inferd.bench import report
    from inferd.bench.plots import plot_bench, pyplot
    from inferd.bench.serve import run_conversations, run_serve, server_trace
    from inferd.bench.workload import conversations, make_requests, workload_vocab
    from inferd.loader import open_checkpoint
    from inferd.tokenizer import checkpoint_tokenizer

    console = _console(args)
    if args.plot:
        pyplot()
    spec = workload_spec(args)
    tokenizer = checkpoint_tokenizer(open_checkpoint(args.tokenizer))
    env_start = report.environment()
    trace = server_trace(args.base_url) if args.profile else nullcontext({})
    if spec.dataset == "multiturn" and args.max_concurrency:
        raise ValueError(
            "a multi-turn workload sends each turn after the previous one, its conversations "
            "at once or starting at --request-rate: drop --max-concurrency"
        )
    with trace as files:
        if spec.dataset == "multiturn":
            talks = conversations(spec, workload_vocab(tokenizer))
            result = run_conversations(args.base_url, talks, model=args.served_model_name,
                                       request_rate=args.request_rate, seed=args.seed,
                                       timeout=args.timeout,
                                       percentiles=args.percentiles)  # fmt: skip
        else:
            requests = make_requests(spec, workload_vocab(tokenizer), tokenizer)
            result = run_serve(args.base_url, requests, model=args.served_model_name,
                               request_rate=args.request_rate,
                               max_concurrency=args.max_concurrency, seed=args.seed,
                               timeout=args.timeout, percentiles=args.percentiles)  # fmt: skip
    env_end = report.environment()
    if spec.dataset == "multiturn":
        title = (f"serve: {spec.num_prompts} conversations of {spec.turns} turns, first prompt "
                 f"{spec.input_len}, answers {spec.output_len} tokens")  # fmt: skip
    else:
        title = (
            f"serve: {spec.num_prompts} requests at {result.info['request_rate']}, prompts "
            f"{spec.input_len}, outputs {spec.output_len} tokens"
        )
    report.print_results(title, [result], console)
    console.print(f"  client machine load average (1 min) {_load(env_start)} → {_load(env_end)}")
    if files.get("trace"):
        console.print(f"  the server's trace: {files['trace']} (top ops: {files['ops_table']})")
    if args.json:
        report.write_json(args.json, _document(args, spec, env_start, env_end, [result], []))
    if args.plot:
        plot_bench([result], args.plot, title)
    return 0 if result.metrics.completed else 1


def _run_startup(args: argparse.Namespace) -> int:
    from inferd.bench import report, startup
    from inferd.bench.peers import parse_peers

    console = _console(args)
    commands = {"inferd": startup.inferd_command(engine_flags_of(args))}
    for name in parse_peers(args.compare):
        if name != "llamacpp":
            console.print(f"[yellow]startup compares with llamacpp only; {name} skipped[/]")
            continue
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            console.print("[yellow]llama.cpp peer skipped: llama-cpp-python is not installed[/]")
            continue
        from inferd.loader import open_checkpoint

        commands["llama.cpp"] = startup.llama_cpp_command(
            str(open_checkpoint(args.model).path), args.threads
        )
    env_start = report.environment()
    if args.cold_runs < 0:
        raise ValueError(f"--cold-runs must be >= 0, got {args.cold_runs}")
    results = []
    if args.cold_runs > 0:
        from inferd.loader.catalog import lookup

        named = lookup(args.model) if args.model else None
        pulled = [named.path] if named is not None and not named.embedded else []
        results.append(startup.run_cold("inferd", commands["inferd"], args.cold_runs, pulled))
    results += startup.run_startup(commands, args.num_runs)
    report.print_startup(results, console)
    console.print(f"  load average (1 min) {_load(env_start)} → {_load(report.environment())}")
    if args.json:
        report.write_json(
            args.json,
            {
                "benchmark": "startup",
                "environment": env_start,
                "results": [r.to_dict() for r in results],
            },
        )
    return 0

"""Serving overhead (issue 24's "Must show"): output tok/s of the same requests over HTTP and
through `LLM.generate`, in one run, and their ratio.

    python scripts/serving_overhead.py [--rounds 3] [--json out.json] [-- SERVE FLAGS...]

The workload is the `throughput32` preset (32 token-id prompts of 16-256 tokens, outputs of
16-128, EOS ignored, greedy). Four measurements, alternating between the two systems so that a
busy spell on a shared machine spreads over both:

    http, 32 clients    streaming /v1/completions, all 32 requests at once (`bench serve`)
    offline, batch      one `LLM.generate` call with all 32 requests
    http, 1 client      the same requests one after another, streaming
    offline, one by one one `LLM.generate` call per request, one after another
                        (these two interleaved: each request over HTTP, then offline)

The server is `inferd serve` started by this script with the flags after `--` (default: none
but the port); the offline engine gets the same engine flags. Both stay loaded for the whole
run; the one not measured is idle (its loop sleeps).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(flags: list[str]) -> tuple[subprocess.Popen, str, str]:
    import httpx

    port = _free_port()
    log = tempfile.mkstemp(prefix="inferd-overhead-", suffix=".log")[1]
    cmd = [sys.executable, "-m", "inferd", "serve", "--port", str(port),
           "--disable-log-requests", *flags]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"inferd serve exited: see {log}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url, log
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"inferd serve did not become healthy: see {log}")


def _offline(system, requests, one_by_one: bool):
    from inferd.bench.metrics import compute_metrics

    t0 = time.perf_counter()
    timings = []
    if one_by_one:
        for r in requests:
            timings += system.generate([r])
    else:
        timings = system.generate(requests)
    return compute_metrics(timings, time.perf_counter() - t0, (50.0, 99.0))


def _one_by_one(url: str, system, requests) -> tuple[float, float]:
    """Seconds each system spent on the requests sent one after another, summed over requests
    (a request's own time, first byte sent to last token). NOTE: interleaved, each request over
    HTTP then offline, so that a slow spell of a shared machine (they last seconds to minutes)
    falls on both alike, as a whole block of each would not."""
    from inferd.bench.serve import run_serve

    http_s = offline_s = 0.0
    for r in requests:
        http_s += run_serve(url, [r]).metrics.e2el.mean
        offline_s += _offline(system, [r], one_by_one=True).e2el.mean
    return http_s, offline_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="repeat the four measurements (the median round is reported)",
    )
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("serve_flags", nargs=argparse.REMAINDER, help="after --: serve flags")
    args = parser.parse_args()
    flags = [f for f in args.serve_flags if f != "--"]

    from inferd.bench.presets import resolve_workload
    from inferd.bench.report import environment
    from inferd.bench.serve import run_serve
    from inferd.bench.systems import InferdSystem, warm_up
    from inferd.bench.workload import BenchRequest, make_requests, workload_vocab
    from inferd.commands import serve as serve_command
    from inferd.commands.engine_args import engine_config_from_args

    serve_parser = argparse.ArgumentParser()
    serve_command.add_arguments(serve_parser)
    config = engine_config_from_args(serve_parser.parse_args(flags))
    proc, url, log = _start_server(flags)
    try:
        system = InferdSystem(config)
        vocab = workload_vocab(system.tokenizer)

        def workload(seed: int) -> list[BenchRequest]:
            spec = resolve_workload("throughput32", input_len=None, output_len=None,
                                    range_ratio=0.0, num_prompts=None, seed=seed,
                                    default_prompts=32)  # fmt: skip
            return make_requests(spec, vocab, system.tokenizer)

        requests = workload(0)
        warm_up(system, requests[0].prompt_token_ids[0])
        run_serve(url, [BenchRequest(requests[0].prompt_token_ids[:8], 4)])  # warm the server
        figures: dict[str, list[float]] = {}

        def note(name: str, tokens: int, seconds: float) -> None:
            figures.setdefault(name, []).append(tokens / seconds)
            rate = tokens / seconds
            print(f"{name:22s} {rate:7.1f} tok/s ({tokens} tokens, {seconds:.1f} s)", flush=True)

        def note_run(name: str, metrics) -> None:
            note(name, metrics.total_output_tokens, metrics.duration)

        env = environment()
        for round_ in range(args.rounds):
            # NOTE: new prompts each round (same lengths distribution, another seed), so no
            # round is served from a prefix cache that an earlier round filled. The server
            # and the offline engine are separate engines: each sees each prompt once.
            requests = workload(round_)
            note_run("http, 32 clients", run_serve(url, requests).metrics)
            note_run("offline, batch", _offline(system, requests, one_by_one=False))
            http_s, offline_s = _one_by_one(url, system, requests)
            tokens = sum(r.output_len for r in requests)
            note("http, 1 client", tokens, http_s)
            note("offline, one by one", tokens, offline_s)
        # NOTE: a ratio per round (both systems ran that round's prompts), then the median.
        pairs = {"32 clients": ("http, 32 clients", "offline, batch"),
                 "1 client": ("http, 1 client", "offline, one by one")}  # fmt: skip
        per_round = {name: sorted(h / o for h, o in zip(figures[a], figures[b], strict=True))
                     for name, (a, b) in pairs.items()}  # fmt: skip
        ratios = {name: r[len(r) // 2] for name, r in per_round.items()}
        for name, ratio in ratios.items():
            rounds = ", ".join(f"{r:.3f}" for r in per_round[name])
            print(f"serving overhead ratio, {name}: {ratio:.3f} (median of rounds: {rounds})")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"figures": figures, "ratios": ratios, "serve_flags": flags,
                           "environment": env, "end": environment()}, f, indent=1)  # fmt: skip
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.unlink(log)
    return 0 if all(math.isfinite(r) for r in ratios.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Data-parallel routing on the multi-turn workload (issue 24's "Must show"): for each routing
policy, a fresh `inferd serve --data-parallel-size 2 --data-parallel-routing POLICY` and
`bench serve --preset multiturn` against it; prints prefix-cache hit rate, TTFT p50/p99 and
output tok/s per policy, in one run.

    python scripts/dp_routing.py [--policies prefix,round-robin] [--request-rate R]
                                 [--json out.json] [-- SERVE FLAGS]

Each policy gets its own server (a fresh prefix cache); the same conversations every time, all
at once or (`--request-rate`) starting at R conversations a second, as `bench serve` sends them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from serving_overhead import _start_server  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", default="prefix,round-robin")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="conversations started a second (default: all at once)",
    )
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("serve_flags", nargs=argparse.REMAINDER, help="after --: serve flags")
    args = parser.parse_args()
    flags = [f for f in args.serve_flags if f != "--"]

    from inferd.bench.presets import resolve_workload
    from inferd.bench.serve import run_conversations
    from inferd.bench.workload import conversations, workload_vocab
    from inferd.loader import open_checkpoint
    from inferd.tokenizer import checkpoint_tokenizer

    spec = resolve_workload("multiturn", input_len=None, output_len=None, range_ratio=0.0,
                            num_prompts=None, seed=0, default_prompts=16)  # fmt: skip
    tokenizer = checkpoint_tokenizer(open_checkpoint(None))
    talks = conversations(spec, workload_vocab(tokenizer))
    figures = []
    for policy in args.policies.split(","):
        proc, url, log = _start_server([*flags, "--data-parallel-size", str(args.replicas),
                                        "--data-parallel-routing", policy])  # fmt: skip
        try:
            result = run_conversations(url, talks, request_rate=args.request_rate)
        finally:
            proc.terminate()
            proc.wait(60)
            os.unlink(log)
        m = result.metrics
        got = {
            "policy": policy,
            "prefix_cache_hit_rate": result.info["prefix cache hit rate"],
            "ttft_p50_ms": 1000 * m.ttft.median,
            "ttft_p99_ms": 1000 * m.ttft.percentiles[99.0],
            "output_tok_s": m.output_throughput,
            "failed": m.failed,
        }
        figures.append(got)
        print(
            f"{policy:13s} hit rate {got['prefix_cache_hit_rate']}, TTFT p50 "
            f"{got['ttft_p50_ms']:.0f} ms p99 {got['ttft_p99_ms']:.0f} ms, "
            f"{m.output_throughput:.1f} output tok/s, {m.failed} failed",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"figures": figures, "serve_flags": flags,
                       "request_rate": args.request_rate}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

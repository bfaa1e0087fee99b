"""KV tiers on the multi-turn workload and across a restart (issue 55's "Must show"), in one run.

    python scripts/kv_tier_bench.py multiturn [--kv-cache-memory 56MiB] [--json out.json]
                                              [-- SERVE FLAGS]
    python scripts/kv_tier_bench.py restart [--system-tokens 4096] [--json out.json]
                                            [-- SERVE FLAGS]

multiturn: `bench serve --preset multiturn` against a fresh `inferd serve` with a small KV pool
(`--kv-cache-memory`, about a quarter of the conversations' working set), without a tier, then
with a RAM tier (`--kv-offload-memory`) and with a disk tier; prints prompt tokens computed,
prefix hit rate (tier loads count as hits) and TTFT p50/p99 for each.

restart: a long shared system prompt; a server with a disk tier answers it once (the blocks are
written), is stopped, and a new server answers a new question after the same system prompt:
its first request's TTFT, against a fresh server with an empty tier (a cold start), each time
the first request after the server became healthy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from serving_overhead import _start_server  # noqa: E402


def _stop(proc, log) -> None:
    proc.terminate()
    proc.wait(60)
    os.unlink(log)


def multiturn(args, flags: list[str]) -> list[dict]:
    from inferd.bench.presets import resolve_workload
    from inferd.bench.serve import run_conversations
    from inferd.bench.workload import conversations, workload_vocab
    from inferd.loader import open_checkpoint
    from inferd.tokenizer import checkpoint_tokenizer

    spec = resolve_workload("multiturn", input_len=None, output_len=None, range_ratio=0.0,
                            num_prompts=None, seed=0, default_prompts=16)  # fmt: skip
    talks = conversations(spec, workload_vocab(checkpoint_tokenizer(open_checkpoint(None))))
    disk = tempfile.mkdtemp(prefix="inferd-kv-bench-")
    tiers = {
        "no tier": [],
        "RAM tier": ["--kv-offload-memory", args.tier_bytes],
        "disk tier": ["--kv-offload-dir", disk, "--kv-offload-disk", args.tier_bytes],
    }
    figures = []
    try:
        for name, tier_flags in tiers.items():
            proc, url, log = _start_server([*flags, "--kv-cache-memory", args.kv_cache_memory,
                                            *tier_flags])  # fmt: skip
            try:
                result = run_conversations(url, talks)
            finally:
                _stop(proc, log)
            m = result.metrics
            got = {"tier": name, "prompt_tokens_computed": result.info["prompt tokens computed"],
                   "prefix_cache_hit_rate": result.info["prefix cache hit rate"],
                   "ttft_p50_ms": 1000 * m.ttft.median,
                   "ttft_p99_ms": 1000 * m.ttft.percentiles[99.0],
                   "output_tok_s": m.output_throughput, "failed": m.failed}  # fmt: skip
            figures.append(got)
            print(f"{name:9s} prompt tokens computed {got['prompt_tokens_computed']}, hit rate "
                  f"{got['prefix_cache_hit_rate']}, TTFT p50 {got['ttft_p50_ms']:.0f} ms p99 "
                  f"{got['ttft_p99_ms']:.0f} ms, {m.output_throughput:.1f} output tok/s, "
                  f"{m.failed} failed", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(disk, ignore_errors=True)
    return figures


def _first_ttft(url: str, prompt: str) -> float:
    """Seconds to the first streamed token of one completion (the server's first request)."""
    import httpx

    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True}
    start = time.perf_counter()
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=3600) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data: ") and '"text"' in line:
                return time.perf_counter() - start
    raise RuntimeError("no token streamed")


def restart(args, flags: list[str]) -> list[dict]:
    from inferd.loader import open_checkpoint
    from inferd.tokenizer import checkpoint_tokenizer

    tokenizer = checkpoint_tokenizer(open_checkpoint(None))
    words = ("the quick brown fox jumps over a lazy dog while rivers run to the sea and "
             "every clock in town strikes noon ").split()  # fmt: skip
    text, i = "You are a careful assistant. Policy:", 0
    while len(tokenizer.encode(text)) < args.system_tokens:
        text += " " + " ".join(words[(i + j) % len(words)] for j in range(64)) + "."
        i += 7
    n = len(tokenizer.encode(text))
    disk = tempfile.mkdtemp(prefix="inferd-kv-restart-")
    tier = ["--kv-offload-dir", disk, "--kv-offload-disk", args.tier_bytes]
    figures = []
    try:
        proc, url, log = _start_server([*flags, *tier])  # fills the tier
        try:
            _first_ttft(url, text + "\nQuestion: what is the policy?")
        finally:
            _stop(proc, log)
        runs = {"cold start": [*flags, "--kv-offload-dir", tempfile.mkdtemp(dir=disk),
                               "--kv-offload-disk", args.tier_bytes],
                "restart with the disk tier": [*flags, *tier]}  # fmt: skip
        for name, run_flags in runs.items():
            proc, url, log = _start_server(run_flags)
            try:
                ttft = _first_ttft(url, text + "\nQuestion: who wrote it?")
            finally:
                _stop(proc, log)
            figures.append({"run": name, "system_prompt_tokens": n, "first_ttft_s": ttft})
            print(
                f"{name:27s} first request TTFT {ttft:.2f} s ({n}-token system prompt)", flush=True
            )
    finally:
        shutil.rmtree(disk, ignore_errors=True)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["multiturn", "restart"])
    parser.add_argument("--kv-cache-memory", default="56MiB",
                        help="the KV pool of the multiturn runs (default 56MiB: about a "
                             "quarter of its working set on the embedded model)")  # fmt: skip
    parser.add_argument("--tier-bytes", default="4GiB", help="each tier's bound")
    parser.add_argument("--system-tokens", type=int, default=4096)
    parser.add_argument("--json", help="write the figures here")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, flags = parser.parse_args(argv[:cut]), argv[cut + 1 :]  # after --: serve flags
    figures = (multiturn if args.what == "multiturn" else restart)(args, flags)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"figures": figures, "serve_flags": flags, "args": vars(args)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

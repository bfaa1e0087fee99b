"""Prefill/decode disaggregation (issue 57's "Must show"), in one run:

    python scripts/disaggregation_bench.py [transfer] [mixed] [--json out.json] [-- SERVE FLAGS]

transfer: the KV hand-over's cost against the steps it sits between, on the embedded model with
one thread (one engine's share of a 2-core machine in a 1 + 1 split):
  - a block's bytes; copying N blocks out of the pool (`read_blocks`) and back in
    (`write_blocks`); writing them into a transfer tier in /dev/shm (BlockStore: header, CRC,
    atomic rename) and reading them back (with the check): GB/s each, and the seconds a
    4096-token prompt's blocks take end to end;
  - a decode step at batch 16, and a prompt's prefill (2048 and 4096 tokens): the share of a
    request's prefill time its KV hand-over adds.

mixed: 16 streams decoding while long prompts (2-4k tokens, --long of them, one every --gap
seconds) arrive, against `inferd serve --disaggregate` (1 prefill + 1 decode engine,
--disaggregate-min-prompt 1024: the streams' short prompts start on the decode engine) and
against `inferd serve --data-parallel-size 2`, on the same cores: the streams' inter-token
gaps while the long prompts are in flight (TPOT p50/p99) and the long prompts' TTFT p50/p99.
Prompts are random token ids (no prefix is shared, so nothing is served from a cache).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from serving_overhead import _start_server  # noqa: E402

BLOCKS = 256  # a 4096-token prompt's blocks (block size 16)
STREAM_MAX = 20000  # a stream's max_tokens: it is stopped when the long prompts are done


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def transfer(args) -> dict:
    from inferd import LLM, SamplingParams
    from inferd.commands.engine_args import size_arg
    from inferd.engine.kv_tiers.block_store import BlockStore

    llm = LLM(num_threads=1, kv_cache_memory=size_arg(args.kv_cache_memory),
              max_num_batched_tokens=512)  # fmt: skip
    runner = llm.engine.runner
    block_bytes = runner.block_bytes()
    groups = len(runner.groups)
    ids = [list(range(1, BLOCKS + 1))] * groups
    rounds, out = 5, {}
    start = time.perf_counter()
    for _ in range(rounds):
        rows = runner.read_blocks(ids)
    out["pool_copy_out_s"] = (time.perf_counter() - start) / rounds
    start = time.perf_counter()
    for _ in range(rounds):
        runner.write_blocks(ids, rows)
    out["pool_copy_in_s"] = (time.perf_counter() - start) / rounds
    root = tempfile.mkdtemp(prefix="inferd-disagg-bench-", dir="/dev/shm")
    try:
        store = BlockStore("memory", root, b"x" * 32, 4 * BLOCKS * (block_bytes + 4096),
                           block_bytes)  # fmt: skip
        payloads = [memoryview(rows[j].numpy()) for j in range(BLOCKS)]
        writes, reads = [], []
        for _ in range(rounds):
            names = [os.urandom(32) for _ in range(BLOCKS)]
            start = time.perf_counter()
            for name, payload in zip(names, payloads, strict=True):
                store.write(name, payload)
            writes.append(time.perf_counter() - start)
            start = time.perf_counter()
            got = [store.read(name) for name in names]
            reads.append(time.perf_counter() - start)
            assert all(g is not None for g in got)
            store.clear()
        out["tier_write_s"] = statistics.median(writes)
        out["tier_read_s"] = statistics.median(reads)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    total = BLOCKS * block_bytes
    out["block_bytes"], out["blocks"], out["bytes"] = block_bytes, BLOCKS, total
    for key in ("pool_copy_out", "pool_copy_in", "tier_write", "tier_read"):
        out[f"{key}_gb_s"] = total / out[f"{key}_s"] / 1e9
    out["handover_4096_s"] = sum(out[f"{k}_s"] for k in ("pool_copy_out", "pool_copy_in",
                                                          "tier_write", "tier_read"))  # fmt: skip
    # the steps it sits between (one thread)
    rng = random.Random(0)
    one = SamplingParams(temperature=0, max_tokens=1)
    llm.generate(
        [{"prompt_token_ids": [rng.randrange(1000, 20000) for _ in range(64)]}], one, use_tqdm=False
    )  # fmt: skip  (warm-up)
    for n in (2048, 4096):
        prompt = {"prompt_token_ids": [rng.randrange(1000, 20000) for _ in range(n)]}
        start = time.perf_counter()
        llm.generate([prompt], one, use_tqdm=False)
        out[f"prefill_{n}_s"] = time.perf_counter() - start
    steps = 64
    batch = [{"prompt_token_ids": [rng.randrange(1000, 20000) for _ in range(32)]}
             for _ in range(16)]  # fmt: skip
    llm.generate(batch, one, use_tqdm=False)  # their prompts: cached from now on
    start = time.perf_counter()
    llm.generate(batch, SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True),
                 use_tqdm=False)  # fmt: skip
    out["decode_step_b16_s"] = (time.perf_counter() - start) / steps
    out["handover_share_of_4096_prefill"] = out["handover_4096_s"] / out["prefill_4096_s"]
    llm.shutdown()
    print(
        f"block {block_bytes} bytes; {BLOCKS} blocks ({total / 1e6:.1f} MB, a 4096-token prompt):",
        flush=True,
    )
    for key, what in (
        ("pool_copy_out", "pool → host copy"),
        ("pool_copy_in", "host → pool copy"),
        ("tier_write", "/dev/shm tier write"),
        ("tier_read", "/dev/shm tier read"),
    ):
        print(f"  {what:22s} {1000 * out[key + '_s']:8.1f} ms  {out[key + '_gb_s']:6.2f} GB/s")
    print(f"  hand-over in all      {1000 * out['handover_4096_s']:8.1f} ms")
    print(
        f"prefill 2048 tokens {out['prefill_2048_s']:.2f} s, 4096 tokens "
        f"{out['prefill_4096_s']:.2f} s; decode step at batch 16 "
        f"{1000 * out['decode_step_b16_s']:.1f} ms (1 thread)"
    )
    print(f"hand-over / prefill of 4096 tokens: {100 * out['handover_share_of_4096_prefill']:.2f}%",
          flush=True)  # fmt: skip
    return out


async def _stream(client, url: str, prompt: list[int], max_tokens: int, arrivals: list[float],
                  stop: asyncio.Event | None = None) -> None:  # fmt: skip
    """One completion, streamed; the arrival time of each chunk with text is appended."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    async with client.stream("POST", url + "/v1/completions", json=body, timeout=None) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            arrivals.append(time.monotonic())
            if stop is not None and stop.is_set():
                return


async def _mixed_run(url: str, args) -> dict:
    import httpx

    rng = random.Random(1)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(1000, 20000) for _ in range(n)]

    async with httpx.AsyncClient(timeout=None) as client:
        warm: list[float] = []  # every engine's first steps (thread pools, kernels)
        await asyncio.gather(*(_stream(client, url, prompt(1100), 2, warm) for _ in range(2)))
        stop = asyncio.Event()
        streams = [[] for _ in range(args.streams)]
        tasks = [asyncio.ensure_future(_stream(client, url, prompt(args.stream_prompt), STREAM_MAX,
                                               s, stop)) for s in streams]  # fmt: skip
        while not all(len(s) >= 2 for s in streams):
            for task in tasks:
                if task.done():
                    task.result()  # a refused stream: its error
            await asyncio.sleep(0.1)
        longs, ttfts, window = [], [], [time.monotonic(), 0.0]

        async def one_long(i: int) -> None:
            await asyncio.sleep(i * args.gap)
            arrivals: list[float] = []
            sent = time.monotonic()
            await _stream(client, url, prompt(rng.randint(2048, 4096)), args.long_tokens,
                          arrivals)  # fmt: skip
            ttfts.append(arrivals[0] - sent)

        longs = [one_long(i) for i in range(args.long)]
        await asyncio.gather(*longs)
        window[1] = time.monotonic()
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    gaps = [b - a for s in streams for a, b in zip(s, s[1:], strict=False)
            if a >= window[0] and b <= window[1]]  # fmt: skip
    per_stream = []
    for s in streams:
        inside = [t for t in s if window[0] <= t <= window[1]]
        if len(inside) > 1:
            per_stream.append((inside[-1] - inside[0]) / (len(inside) - 1))
    return {"itl_p50_ms": 1000 * _pct(gaps, 50), "itl_p99_ms": 1000 * _pct(gaps, 99),
            "tpot_mean_ms": 1000 * statistics.mean(per_stream),
            "ttft_p50_s": _pct(ttfts, 50), "ttft_p99_s": _pct(ttfts, 99),
            "stream_tokens_in_window": len(gaps), "window_s": window[1] - window[0]}  # fmt: skip


def _metric_lines(url: str) -> list[str]:
    import httpx

    text = httpx.get(url + "/metrics", timeout=10).text
    return [line for line in text.splitlines() if line.startswith("inferd:kv_transfer")
            or line.startswith("inferd:engine_role")]  # fmt: skip


def mixed(args, flags: list[str]) -> list[dict]:
    common = ["--kv-cache-memory", args.kv_cache_memory, "--max-num-seqs", "32", *flags]
    setups = {
        "disaggregated 1+1": ["--disaggregate", "--prefill-engines", "1", "--decode-engines",
                              "1", "--disaggregate-min-prompt", "1024"],
        "colocated dp 2": ["--data-parallel-size", "2"],
    }  # fmt: skip
    figures = []
    for name, setup in setups.items():
        proc, url, log = _start_server([*common, *setup])
        try:
            got = asyncio.run(_mixed_run(url, args))
            extra = _metric_lines(url) if "disagg" in name else []
        finally:
            proc.terminate()
            proc.wait(60)
            os.unlink(log)
        got["setup"] = name
        figures.append(got)
        print(f"{name:18s} stream TPOT p50 {got['itl_p50_ms']:.0f} ms p99 {got['itl_p99_ms']:.0f} "
              f"ms (mean per stream {got['tpot_mean_ms']:.0f} ms); long prompts' TTFT p50 "
              f"{got['ttft_p50_s']:.1f} s p99 {got['ttft_p99_s']:.1f} s "
              f"({got['stream_tokens_in_window']} stream tokens in {got['window_s']:.0f} s)",
              flush=True)  # fmt: skip
        for line in extra:
            print("   ", line)
    return figures


def main() -> None:
    argv = sys.argv[1:]
    flags = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("parts", nargs="*", default=["transfer", "mixed"],
                   help="transfer, mixed (default: both)")  # fmt: skip
    p.add_argument("--streams", type=int, default=16, help="decoding streams (default: 16)")
    p.add_argument("--stream-prompt", type=int, default=64,
                   help="each stream's prompt tokens (default: 64)")  # fmt: skip
    p.add_argument("--long", type=int, default=4, help="long prompts (default: 4)")
    p.add_argument("--gap", type=float, default=10.0,
                   help="seconds between long prompts (default: 10)")  # fmt: skip
    p.add_argument("--long-tokens", type=int, default=8,
                   help="tokens each long prompt generates (default: 8)")  # fmt: skip
    p.add_argument("--kv-cache-memory", default="1GiB", help="per engine (default: 1GiB)")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)
    result = {"cpu": os.cpu_count()}
    if "transfer" in args.parts:
        result["transfer"] = transfer(args)
    if "mixed" in args.parts:
        result["mixed"] = mixed(args, flags)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()

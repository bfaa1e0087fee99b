"""Priority scheduling and the queue deadline under load (issue 56's "Must show"), in one run.

    python scripts/priority_and_deadline.py priority [--streams 16] [--probes 12] [-- SERVE FLAGS]
    python scripts/priority_and_deadline.py deadline [--requests 200] [--max-queue-time 2]

priority: a server saturated by `--streams` low-priority streams (200-token answers, each
replaced as soon as it ends, in as many seats as `--max-num-seqs` gives), while probe requests
arrive one after another; each probe's TTFT, first under `--scheduling-policy fcfs`
(every request priority 0), then under `priority` (streams priority 10, probes 0).

deadline: `--requests` requests at once against `--max-queue-time`; how many got a 503, how fast
(seconds from sending to the answer), and the engine core processes' resident memory before,
at the peak, and after.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from serving_overhead import _start_server  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper and the sea. " * 4


async def _ttft(client, url: str, priority: int, max_tokens: int) -> float:
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}  # fmt: skip
    if priority:
        body["priority"] = priority
    start = time.perf_counter()
    first = None
    async with client.stream("POST", url + "/v1/completions", json=body, timeout=3600) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if first is None and line.startswith("data: ") and '"text"' in line:
                first = time.perf_counter() - start
    return first


async def _priority_run(url: str, streams: int, probes: int, low: int) -> list[float]:
    import httpx

    async def stream_forever(client, delay: float) -> None:
        await asyncio.sleep(delay)  # staggered: the streams end one after another
        while True:  # closed loop: a stream that ends is replaced, the server stays saturated
            await _ttft(client, url, low, 200)

    limits = httpx.Limits(max_connections=streams + 8)
    async with httpx.AsyncClient(limits=limits) as client:
        load = [asyncio.ensure_future(stream_forever(client, 0.5 * i)) for i in range(streams)]
        await asyncio.sleep(0.5 * streams + 5.0)  # every stream is running
        ttfts = []
        for _ in range(probes):
            ttfts.append(await _ttft(client, url, 0, 4))
            await asyncio.sleep(0.2)
        for task in load:
            task.cancel()
        await asyncio.gather(*load, return_exceptions=True)
    return ttfts


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def priority(args, flags: list[str]) -> None:
    for policy, low in (("fcfs", 0), ("priority", 10)):
        proc, url, log = _start_server([*flags, "--scheduling-policy", policy])
        try:
            ttfts = asyncio.run(_priority_run(url, args.streams, args.probes, low))
        finally:
            proc.terminate()
            proc.wait(60)
        print(f"{policy:8s} probe TTFT p50 {statistics.median(ttfts) * 1000:.0f} ms, p99 "
              f"{_percentile(ttfts, 99) * 1000:.0f} ms ({len(ttfts)} probes, {args.streams} "
              f"streams of 200 tokens)", flush=True)  # fmt: skip


def _core_rss(server_pid: int) -> int:
    import psutil

    children = psutil.Process(server_pid).children(recursive=True)
    return sum(p.memory_info().rss for p in children) + psutil.Process(server_pid).memory_info().rss


async def _flood(url: str, n: int, server_pid: int) -> tuple[list[tuple[int, float]], int]:
    import httpx

    peak = 0

    async def one(client) -> tuple[int, float]:
        start = time.perf_counter()
        body = {"prompt": PROMPT, "max_tokens": 32, "temperature": 0, "ignore_eos": True}
        resp = await client.post(url + "/v1/completions", json=body, timeout=3600)
        return resp.status_code, time.perf_counter() - start

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, _core_rss(server_pid))
            await asyncio.sleep(0.2)

    limits = httpx.Limits(max_connections=n + 8)
    async with httpx.AsyncClient(limits=limits) as client:
        watcher = asyncio.ensure_future(watch())
        results = await asyncio.gather(*(one(client) for _ in range(n)))
        watcher.cancel()
    return results, peak


def deadline(args, flags: list[str]) -> None:
    proc, url, log = _start_server([*flags, "--max-queue-time", str(args.max_queue_time)])
    try:
        before = _core_rss(proc.pid)
        results, peak = asyncio.run(_flood(url, args.requests, proc.pid))
        time.sleep(2)
        after = _core_rss(proc.pid)
    finally:
        proc.terminate()
        proc.wait(60)
    refused = [s for code, s in results if code == 503]
    served = [s for code, s in results if code == 200]
    print(f"{len(served)} served, {len(refused)} got 503 (of {len(results)}; --max-queue-time "
          f"{args.max_queue_time:g} s)", flush=True)  # fmt: skip
    if refused:
        print(f"503 after p50 {statistics.median(refused):.2f} s, max {max(refused):.2f} s")
    print(f"server + cores RSS: before {before / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB, "
          f"after {after / 2**20:.0f} MiB")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["priority", "deadline"])
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--probes", type=int, default=12)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--max-queue-time", type=float, default=2.0)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, flags = parser.parse_args(argv[:cut]), argv[cut + 1 :]  # after --: serve flags
    (priority if args.what == "priority" else deadline)(args, flags)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The multi-turn workload against inferd on Ray Serve, once per request router (figures from one
machine are provisional: run it on a quiet one).

    python scripts/ray_multiturn_bench.py [--routers prefix,ray-prefix,pow2] [--replicas 2]
        [--conversations 8] [--turns 4] [--system-words 300] [--user-words 30]
        [--output-tokens 24] [--kill-at SECONDS] [--model MODEL] [--json FILE]

Its workload is its own (`inferd bench serve --preset multiturn` has no system prompts): each
conversation has a long system prompt of its own and alternates user turns with the model's
replies; a turn's prompt is the previous turn's prompt, its reply and a new user message, so
the replica that served the last turn holds most of the next one in its prefix cache. The
conversations run at once, each turn after the previous reply (streamed chat completions,
greedy, `ignore_eos`, so every reply has exactly --output-tokens tokens).

For each router it starts a fresh application (cold caches) on a local Ray cluster (or the one
at --ray-address), then reports the prefix-cache hit rate (the replicas' hits over queries,
from /metrics), TTFT p50/p99 and output tokens per second (client side, vLLM's definitions,
inferd/bench/metrics.py), and inferd's routing decisions. With --kill-at, a replica is killed
that many seconds into each run: the failed requests, and the seconds until Serve's replacement
served.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import socket
import time

import httpx

from inferd.bench.metrics import RequestTiming, compute_metrics

WORDS = ("river stone light garden window morning paper letter silver autumn market bridge "
         "forest ocean winter music thunder harbor lantern meadow cotton copper island valley "
         "mirror candle engine anchor castle feather orchard planet ribbon saddle temple violet "
         "wagon yellow zephyr basket canyon desert harvest jungle kettle ladder marble needle "
         "pepper quartz rocket summer tunnel velvet walnut").split()  # fmt: skip


def words(seed: str, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric_sum(text: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


async def chat_turn(client: httpx.AsyncClient, url: str, messages: list, out_tokens: int
                    ) -> tuple[RequestTiming, str]:  # fmt: skip
    body = {"messages": messages, "max_tokens": out_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    start, first, chunks, text, error, usage = time.perf_counter(), None, [], "", None, {}
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    error = event["error"]["message"]
                    continue
                usage = event.get("usage") or usage
                for choice in event.get("choices", []):
                    piece = choice["delta"].get("content") or ""
                    if piece:
                        now = time.perf_counter()
                        first = first or now
                        chunks.append(now)
                        text += piece
            if r.status_code != 200:
                error = error or f"HTTP {r.status_code}"
    except httpx.HTTPError as e:
        error = f"{type(e).__name__}: {e}"
    end = chunks[-1] if chunks else time.perf_counter()
    timing = RequestTiming(start, first, end, usage.get("prompt_tokens", 0),
                           usage.get("completion_tokens", 0), tuple(chunks), error)  # fmt: skip
    return timing, text


async def conversation(client, url: str, c: int, args) -> list[RequestTiming]:
    messages = [
        {"role": "system", "content": f"Conversation {c}. " + words(f"s{c}", args.system_words)}
    ]
    timings = []
    for t in range(args.turns):
        messages.append({"role": "user", "content": words(f"u{c}-{t}", args.user_words)})
        timing, reply = await chat_turn(client, url, messages, args.output_tokens)
        timings.append(timing)
        if timing.error:  # the conversation goes on from the last good turn
            messages.pop()
            continue
        messages.append({"role": "assistant", "content": reply})
    return timings


def per_replica(text: str, name: str) -> dict[str, float]:
    """Replica → its sample of `name` (a /metrics family with a `replica` label)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[s.labels["replica"]] = s.value
    return out


def replicas(url: str) -> dict[str, float]:
    """Live replicas → requests each holds (running or waiting)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    running = per_replica(text, "inferd:replica_num_requests_running")
    waiting = per_replica(text, "inferd:replica_num_requests_waiting")
    return {r: n + waiting.get(r, 0) for r, n in running.items()}


async def killer(url: str, at: float, wanted: int, report: dict) -> None:
    import ray

    await asyncio.sleep(at)
    running = await asyncio.to_thread(replicas, url)
    victim = max(running, key=running.get)
    ray.kill(ray.get_actor(f"SERVE_REPLICA::inferd#InferdEngine#{victim}", namespace="serve"))
    killed = time.monotonic()
    report.update(victim=victim, requests_on_it=running[victim])  # as of its last report
    while time.monotonic() - killed < 300:
        now = await asyncio.to_thread(replicas, url)
        if len(now) >= wanted and victim not in now:
            report["replaced_after_s"] = round(time.monotonic() - killed, 1)
            return
        await asyncio.sleep(0.5)


async def warm_up(url: str, replicas: int) -> None:
    """A few short conversations first, so that no replica's first steps (lazy set-up on first
    use) land in the figures."""
    async with httpx.AsyncClient(timeout=600) as client:
        turns = [[{"role": "user", "content": words(f"w{i}", 40)}] for i in range(2 * replicas)]
        await asyncio.gather(*(chat_turn(client, url, m, 2) for m in turns))


async def run_workload(url: str, args) -> tuple[list[RequestTiming], float, dict]:
    kill: dict = {}
    async with httpx.AsyncClient(timeout=600) as client:
        started = time.perf_counter()
        tasks = [conversation(client, url, c, args) for c in range(args.conversations)]
        if args.kill_at is not None:
            kill_task = asyncio.create_task(killer(url, args.kill_at, args.replicas, kill))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - started
        if args.kill_at is not None:
            await kill_task
    return [t for conv in results for t in conv], duration, kill


def one_router(router: str, url: str, args) -> dict:
    from ray import serve

    from inferd.commands.serve_ray import build_app

    values = {"num_replicas": args.replicas, "replica_cpus": args.replica_cpus,
              "request_router": router, "disable_log_requests": True,
              "max_model_len": args.max_model_len, "kv_cache_memory": args.kv_cache_memory,
              "threads": args.threads, "dtype": args.dtype}  # fmt: skip
    if args.model:
        values["model"] = args.model
    t0 = time.monotonic()
    serve.run(build_app(values), name="inferd", route_prefix="/")
    deploy_s = time.monotonic() - t0
    asyncio.run(warm_up(url, args.replicas))
    before = httpx.get(url + "/metrics").text
    timings, duration, kill = asyncio.run(run_workload(url, args))
    time.sleep(2.5)  # the replicas' last reports
    after = httpx.get(url + "/metrics").text
    serve.delete("inferd")
    queries = metric_sum(after, "inferd:prefix_cache_queries_total") - metric_sum(
        before, "inferd:prefix_cache_queries_total")  # fmt: skip
    hits = metric_sum(after, "inferd:prefix_cache_hits_total") - metric_sum(
        before, "inferd:prefix_cache_hits_total")  # fmt: skip
    decisions = {d: metric_sum(after, "inferd:router_decisions_total", decision=d)
                 for d in ("prefix_hit", "no_prefix_match", "prefix_replica_busy")}  # fmt: skip
    # Requests per replica (every reply has --output-tokens tokens): how the router spread them.
    tokens = per_replica(after, "inferd:replica_generation_tokens_total")
    spread = sorted((round(v / args.output_tokens) for v in tokens.values()), reverse=True)
    m = compute_metrics(timings, duration)
    errors = sorted({t.error for t in timings if t.error})
    return {
        "router": router,
        "deploy_s": round(deploy_s, 1),
        "requests": len(timings),
        "failed": m.failed,
        "errors": errors[:3],
        "prefix_cache_hit_rate": round(hits / queries, 3) if queries else None,
        "ttft_p50_ms": round(m.ttft.median * 1000) if m.ttft else None,
        "ttft_p99_ms": round(m.ttft.p99 * 1000) if m.ttft else None,
        "output_tok_s": round(m.output_throughput, 1),
        "duration_s": round(duration, 1),
        "decisions": {k: int(v) for k, v in decisions.items() if v},
        "requests_per_replica": spread,
        **({"kill": kill} if kill else {}),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--routers", default="prefix,ray-prefix,pow2")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--replica-cpus", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=1, help="engine threads per replica")
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-words", type=int, default=300)
    p.add_argument("--user-words", type=int, default=30)
    p.add_argument("--output-tokens", type=int, default=24)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--kv-cache-memory", default="256MiB")
    p.add_argument("--model", default=None, help="default: the embedded model")
    p.add_argument(
        "--dtype",
        default="bfloat16",
        help="the engines' --dtype (bfloat16: dense weights, no copy made lazily)",
    )
    p.add_argument("--kill-at", type=float, default=None,
                   help="kill the busiest replica this many seconds into each run")  # fmt: skip
    p.add_argument("--ray-address", default=None, help="join this cluster (default: start one)")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()

    import ray
    from ray import serve

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    ray.init(address=args.ray_address, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False)  # fmt: skip
    port = free_port()
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    url = f"http://127.0.0.1:{port}"
    results = []
    try:
        for router in args.routers.split(","):
            result = one_router(router, url, args)
            print(json.dumps(result), flush=True)
            results.append(result)
    finally:
        serve.shutdown()
        ray.shutdown()
    print(f"\n{'router':<11} {'hit rate':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'out tok/s':>9} "
          f"{'failed':>6}")  # fmt: skip
    for r in results:
        print(f"{r['router']:<11} {r['prefix_cache_hit_rate']!s:>8} {r['ttft_p50_ms']!s:>7}ms "
              f"{r['ttft_p99_ms']!s:>7}ms {r['output_tok_s']:>9} {r['failed']:>6}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()

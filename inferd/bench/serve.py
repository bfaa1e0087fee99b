"""Serving benchmark: drive a running OpenAI-compatible server (`inferd serve`, vLLM, llama.cpp's
server, ...) with streaming `/v1/completions` requests and time them on the client side.

Requests leave with Poisson arrivals at `request_rate` per second (inf: all at once), at most
`max_concurrency` in flight. A multi-turn workload (bench/workload.py `conversations`) starts its
conversations the same way (Poisson at `request_rate`, or all at once), each turn sent when the
previous one finished, and reports the server's prefix-cache hit rate over the run (its /metrics
counters, every engine's).

TTFT is the first chunk carrying text, ITL the gaps between such chunks, E2EL the last such chunk,
as vLLM's `benchmark_serving` measures them. Prompts go as token id lists with `ignore_eos`, so
the server processes exactly the generated workload.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager

import msgspec
import numpy as np

from inferd.bench.metrics import (
    DEFAULT_PERCENTILES,
    RequestTiming,
    SystemResult,
    compute_metrics,
    count_mismatches,
)
from inferd.bench.sse_events import SSEDataSplitter
from inferd.bench.workload import BenchRequest

# NOTE: the client shares the machine's cores with the server it measures, so its cost per
# streamed event counts against every server alike: msgspec's decoder and uvloop's event loop
# (the server's too, under uvicorn) cost less per event than the json module and asyncio's.
_decode_event = msgspec.json.Decoder().decode


def _run_client(coroutine):
    """Run the client's coroutine to completion on a fresh event loop (uvloop where there is
    one: not on Windows)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


def arrival_gaps(n: int, request_rate: float, seed: int) -> list[float]:
    """Seconds to wait before each request: 0 for the first, then exponential gaps of mean
    1/rate (a Poisson process); all zeros for an infinite rate."""
    if request_rate <= 0:
        raise ValueError(f"--request-rate must be positive (or inf), got {request_rate}")
    if math.isinf(request_rate) or n == 0:
        return [0.0] * n
    rng = np.random.default_rng(seed)
    return [0.0, *rng.exponential(1.0 / request_rate, size=n - 1).tolist()]


def _payload(model: str, r: BenchRequest) -> dict:
    return {
        "model": model,
        "prompt": r.prompt_token_ids,
        "max_tokens": r.output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def _send(session, url: str, model: str, r: BenchRequest) -> RequestTiming:
    import aiohttp

    start = time.perf_counter()
    chunks: list[float] = []
    usage_tokens = finish = None
    try:
        async with session.post(url, json=_payload(model, r)) as resp:
            if resp.status != 200:
                body = (await resp.read()).decode(errors="replace")[:300]
                return RequestTiming(
                    start,
                    None,
                    time.perf_counter(),
                    r.prompt_len,
                    0,
                    error=f"HTTP {resp.status}: {body}",
                )
            events, done = SSEDataSplitter(), False
            async for chunk in resp.content.iter_any():  # what arrived, not a line per await
                now = time.perf_counter()
                for data in events.feed(chunk):
                    if data.strip() == b"[DONE]":
                        done = True
                        break
                    event = _decode_event(data)
                    if event.get("usage"):
                        usage_tokens = event["usage"].get("completion_tokens")
                    for choice in event.get("choices") or []:
                        if choice.get("text"):
                            chunks.append(now)
                        finish = choice.get("finish_reason") or finish
                if done:
                    break
    except (TimeoutError, aiohttp.ClientError, ValueError) as e:  # ValueError: bad JSON
        return RequestTiming(
            start, None, time.perf_counter(), r.prompt_len, 0, error=f"{type(e).__name__}: {e}"
        )
    if usage_tokens is not None:
        n = int(usage_tokens)
    else:  # no usage chunk: a length finish means all asked tokens; else count text chunks
        n = r.output_len if finish == "length" else len(chunks)
    end = chunks[-1] if chunks else time.perf_counter()
    first = chunks[0] if chunks else None
    error = None if chunks else "the stream carried no text"
    return RequestTiming(start, first, end, r.prompt_len, n, tuple(chunks), error)


@asynccontextmanager
async def _session(timeout: float):
    """The client every benchmark request goes through. NOTE: aiohttp, as vLLM's benchmark
    uses: the client shares the machine with the server, and per streamed event it costs
    about half the CPU time of httpx's async client. No connection limit: a request waiting
    for a pooled connection would have its queueing counted as server latency;
    --max-concurrency is the only limit."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0)
    limit = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=limit) as session:
        yield session


async def _reach(session, base_url: str) -> str:
    import aiohttp

    try:
        return await _model_name(session, base_url)
    except (TimeoutError, aiohttp.ClientError) as e:
        raise ValueError(f"cannot reach the server at {base_url}: {e}") from e


def _need_aiohttp() -> None:
    try:
        import aiohttp  # noqa: F401
    except ImportError as e:
        raise ValueError("bench serve needs aiohttp: pip install 'inferd[bench]'") from e


async def _model_name(session, base_url: str) -> str:
    async with session.get(f"{base_url}/v1/models") as resp:
        resp.raise_for_status()
        models = (await resp.json()).get("data") or []
    if not models:
        raise ValueError(f"{base_url}/v1/models lists no model; pass --served-model-name")
    return models[0]["id"]


async def _run(
    base_url: str,
    model: str | None,
    requests: Sequence[BenchRequest],
    request_rate: float,
    max_concurrency: int | None,
    seed: int,
    timeout: float,
) -> tuple[list[RequestTiming], float, str]:
    base_url = base_url.rstrip("/")
    url = f"{base_url}/v1/completions"
    async with _session(timeout) as client:
        model = model or await _reach(client, base_url)
        probe = await _send(client, url, model, BenchRequest(requests[0].prompt_token_ids, 2))
        if probe.error:
            raise ValueError(f"the test request to {url} failed: {probe.error}")
        gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None

        async def limited(r: BenchRequest) -> RequestTiming:
            if gate is None:
                return await _send(client, url, model, r)
            async with gate:
                return await _send(client, url, model, r)

        gaps = arrival_gaps(len(requests), request_rate, seed)
        tasks = []
        t0 = time.perf_counter()
        for gap, r in zip(gaps, requests, strict=True):
            if gap:
                await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(limited(r)))
        timings = await asyncio.gather(*tasks)
        return list(timings), time.perf_counter() - t0, model


def run_serve(
    base_url: str,
    requests: Sequence[BenchRequest],
    *,
    model: str | None = None,
    request_rate: float = math.inf,
    max_concurrency: int | None = None,
    seed: int = 0,
    timeout: float = 600.0,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> SystemResult:
    _need_aiohttp()
    timings, duration, model = _run_client(
        _run(base_url, model, requests, request_rate, max_concurrency, seed, timeout)
    )
    rate = "inf" if math.isinf(request_rate) else f"{request_rate:g}/s"
    result = SystemResult(
        system="server",
        metrics=compute_metrics(timings, duration, percentiles),
        info={
            "base_url": base_url,
            "model": model,
            "request_rate": rate,
            "max_concurrency": str(max_concurrency or "unlimited"),
        },
        notes=count_mismatches(timings, [r.output_len for r in requests]),
        timings=timings,
    )
    errors = sorted({t.error for t in timings if t.error})
    result.notes += [f"failed: {e}" for e in errors[:3]]
    return result


_COUNTERS = {
    "hits": "inferd:prefix_cache_hits_total",
    "queries": "inferd:prefix_cache_queries_total",
    "computed": "inferd:prompt_tokens_total",
}


async def _prefix_counts(client, base_url: str) -> dict[str, float] | None:
    """Prefix-cache hits and queries (blocks loaded from a KV tier count as hits) and prompt
    tokens computed, summed over the server's engines; None when its /metrics has no such
    counters."""
    async with client.get(f"{base_url}/metrics") as resp:
        if resp.status != 200:
            return None
        text = await resp.text()
    totals = dict.fromkeys(_COUNTERS, 0.0)
    found = False
    for line in text.splitlines():
        for key, name in _COUNTERS.items():
            if line.startswith(name):
                totals[key] += float(line.rsplit(" ", 1)[1])
                found = True
    return totals if found else None


async def _run_conversations(base_url: str, model: str | None, conversations, timeout: float,
                             request_rate: float, seed: int):  # fmt: skip
    base_url = base_url.rstrip("/")
    url = f"{base_url}/v1/completions"
    async with _session(timeout) as client:
        model = model or await _reach(client, base_url)
        before = await _prefix_counts(client, base_url)

        async def converse(start: float, turns) -> list[RequestTiming]:
            await asyncio.sleep(start)
            return [await _send(client, url, model, r) for r in turns]

        starts = np.cumsum(arrival_gaps(len(conversations), request_rate, seed)).tolist()
        t0 = time.perf_counter()
        talks = zip(starts, conversations, strict=True)
        timings = await asyncio.gather(*(converse(start, turns) for start, turns in talks))
        duration = time.perf_counter() - t0
        after = await _prefix_counts(client, base_url)
    counts = None
    if before is not None and after is not None and after["queries"] > before["queries"]:
        counts = {key: after[key] - before[key] for key in after}
    return [t for turns in timings for t in turns], duration, model, counts


def run_conversations(
    base_url: str,
    conversations,
    *,
    model: str | None = None,
    request_rate: float = math.inf,
    seed: int = 0,
    timeout: float = 600.0,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> SystemResult:
    """A multi-turn workload: conversations starting at `request_rate` a second (Poisson
    arrivals; inf: all at once), each sending its turns one after another."""
    _need_aiohttp()
    timings, duration, model, counts = _run_client(
        _run_conversations(base_url, model, conversations, timeout, request_rate, seed)
    )
    turns = max(len(c) for c in conversations)
    result = SystemResult(
        system="server",
        metrics=compute_metrics(timings, duration, percentiles),
        info={
            "base_url": base_url,
            "model": model,
            "conversations": f"{len(conversations)} of {turns} turns, "
            + ("at once" if math.isinf(request_rate) else f"starting at {request_rate:g}/s"),
            "prefix cache hit rate": "n/a"
            if counts is None
            else f"{counts['hits'] / counts['queries']:.3f}",
            "prompt tokens computed": "n/a"
            if counts is None
            else f"{counts['computed']:.0f} of {counts['queries']:.0f}",
        },
        notes=count_mismatches(timings, [r.output_len for c in conversations for r in c]),
    )
    errors = sorted({t.error for t in timings if t.error})
    result.notes += [f"failed: {e}" for e in errors[:3]]
    return result


@contextmanager
def server_trace(base_url: str, timeout: float = 600.0) -> Iterator[dict]:
    """A trace of the run on the server (vLLM's `benchmark_serving --profile`): /start_profile
    before, /stop_profile after. Yields a dict that holds, after the run, what the stop answered
    (inferd: the trace's paths on the server)."""
    import httpx

    started = httpx.post(base_url.rstrip("/") + "/start_profile", timeout=timeout)
    if started.status_code == 404:
        raise ValueError(f"--profile: {base_url} has no /start_profile (start the server with "
                         "--profiler-dir DIR)")  # fmt: skip
    started.raise_for_status()
    files: dict = {}
    try:
        yield files
    finally:
        stopped = httpx.post(base_url.rstrip("/") + "/stop_profile", timeout=timeout)
        if stopped.status_code == 200 and stopped.content:
            files.update(stopped.json())  # vLLM answers with an empty body

"""A soak: 1,000 requests mixing valid ones (tiny max_tokens), streams aborted after their first
chunk, clients that disconnect while waiting, and bad input, 16 at a time, against one server.
Afterwards: no 5xx, no KV block held, nothing running, /health fine throughout, and the server's
resident memory within 10% of what it was after the first 100 requests. The same server then
takes the issue's burst: 64 simultaneous streams on 64 free sequence slots with
--max-queued-requests 32 are all admitted.

NOTE: resident memory has two high-water marks that are not leaks but could land after the
100th request: the KV pool's pages are committed as blocks are first used (prefix caching keeps
freed blocks, so new ones are taken until the pool is spent), and the allocator keeps its
largest buffers (a logits row alone is 262,144 floats) once the batch first peaks. Measured over
2,000 requests with a 2 GiB pool: +64-150 MiB within the first 500, flat from then on. So the
pool here is small (64 MiB) and 48 requests at once take the batch past its peak first."""

from __future__ import annotations

import asyncio
import itertools
import time

import httpx
import psutil
import pytest
from reliability_helpers import HealthWatch
from server_helpers import metric, start_server, wait_for

pytestmark = pytest.mark.slow

TOTAL, CONCURRENCY, RSS_AFTER = 1000, 16, 100

VALID = {"prompt": "The capital of France is", "max_tokens": 2, "temperature": 0}
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
LONG = {"prompt": "Tell me a story.", "max_tokens": 200, "ignore_eos": True}
BAD = [
    ("/v1/completions", {"prompt": "a", "temperature": -1}),
    ("/v1/completions", {"prompt": [[2, 818]] * 300}),
    ("/v1/completions", {"prompt": "a", "model": "nope"}),
    ("/v1/chat/completions", {"messages": [], "max_tokens": 1}),
    ("/v1/completions", b'{"prompt": "a\\ud800"}'),
    ("/v1/completions", b"{not json"),
    ("/detokenize", {"tokens": [-5]}),
]


@pytest.fixture(scope="module")
def soak_server():
    server = start_server("--dtype", "auto", "--max-model-len", "512", "--max-queued-requests",
                          "32", "--kv-cache-memory", "64MiB")  # fmt: skip
    try:
        yield server
    finally:
        server.stop()


async def one(http: httpx.AsyncClient, i: int, statuses: list[int]) -> None:
    kind = i % 10
    if kind <= 3:
        r = await http.post("/v1/completions", json={**VALID, "seed": i})
    elif kind == 4:
        r = await http.post("/v1/chat/completions", json=CHAT)
    elif kind == 5:
        async with http.stream("POST", "/v1/completions", json={**VALID, "stream": True}) as r:
            async for _ in r.aiter_lines():
                pass
    elif kind == 6:  # abort: the client closes the stream after the first chunk
        async with http.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    break
    elif kind == 7:  # disconnect: the client gives up on a plain request while it runs
        try:
            r = await http.post("/v1/completions", json=LONG, timeout=0.05 + (i % 7) * 0.05)
        except httpx.TimeoutException:
            return
    else:
        path, body = BAD[i % len(BAD)]
        if isinstance(body, bytes):
            r = await http.post(path, content=body, headers={"Content-Type": "application/json"})
        else:
            r = await http.post(path, json=body)
    statuses.append(r.status_code)


async def soak(url: str, rss_probe) -> tuple[list[int], float]:
    statuses: list[int] = []
    rss_at = 0.0
    counter = itertools.count()

    async def worker(http: httpx.AsyncClient) -> None:
        nonlocal rss_at
        while (i := next(counter)) < TOTAL:
            await one(http, i, statuses)
            if i == RSS_AFTER:
                rss_at = rss_probe()

    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        await asyncio.gather(*(worker(http) for _ in range(CONCURRENCY)))
    return statuses, rss_at


async def warm_up(url: str) -> None:
    """Past the soak's largest batch (see the NOTE above)."""
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        batch = [http.post("/v1/completions", json={**VALID, "max_tokens": 4, "seed": i})
                 for i in range(48)]  # fmt: skip
        assert {r.status_code for r in await asyncio.gather(*batch)} == {200}


def resident(server: psutil.Process) -> int:
    """Resident bytes of the server and its engine core process(es)."""
    return sum(p.memory_info().rss for p in (server, *server.children(recursive=True)))


def test_a_thousand_mixed_requests_leave_nothing_behind(soak_server):
    process = psutil.Process(soak_server.proc.pid)
    asyncio.run(warm_up(soak_server.url))
    with httpx.Client(base_url=soak_server.url, timeout=60) as http:
        idle_usage = metric(http, "inferd:kv_cache_usage_perc")
        with HealthWatch(soak_server.url, every_s=0.5) as watch:
            started = time.monotonic()
            statuses, rss_early = asyncio.run(soak(soak_server.url, lambda: resident(process)))
            seconds = time.monotonic() - started
        watch.assert_healthy()
        assert wait_for(lambda: metric(http, "inferd:num_requests_running") == 0, timeout=30)
        assert metric(http, "inferd:kv_cache_usage_perc") == idle_usage == 0.0
        assert metric(http, "inferd:num_requests_waiting") == 0
    assert soak_server.proc.poll() is None
    assert not [s for s in statuses if s >= 500], sorted(set(statuses))
    assert statuses.count(200) >= 600 and statuses.count(400) >= 50
    rss_end = resident(process)
    assert rss_end <= 1.10 * rss_early, (rss_early >> 20, rss_end >> 20)
    print(f"\nsoak: {TOTAL} requests in {seconds:.1f} s; RSS {rss_early >> 20} MiB after "
          f"{RSS_AFTER}, {rss_end >> 20} MiB after {TOTAL}")  # fmt: skip


def test_sixty_four_streams_on_sixty_four_free_slots_are_all_admitted(soak_server):
    async def burst() -> list[tuple[int, float]]:
        results: list[tuple[int, float]] = []
        release = asyncio.Event()

        async def stream(http: httpx.AsyncClient, i: int) -> None:
            start = time.monotonic()
            body = {**LONG, "prompt": f"Story {i}:", "stream": True}
            async with http.stream("POST", "/v1/completions", json=body) as r:
                # NOTE: a stream's status line goes out once its request is admitted and
                # queued in the engine, before any token (a waiting one has no seat yet).
                results.append((r.status_code, time.monotonic() - start))
                await release.wait()

        limits = httpx.Limits(max_connections=128)
        async with httpx.AsyncClient(base_url=soak_server.url, timeout=120, limits=limits) as h:
            tasks = [asyncio.ensure_future(stream(h, i)) for i in range(64 + 32 + 8)]
            while len(results) < len(tasks):
                await asyncio.sleep(0.05)
            release.set()
            await asyncio.gather(*tasks)
        return results

    results = asyncio.run(burst())
    statuses = sorted(s for s, _ in results)
    # 64 start, 32 may wait, the last 8 are refused at once
    assert statuses == [200] * 96 + [503] * 8, statuses
    assert max(t for s, t in results if s == 503) < 5
    with httpx.Client(base_url=soak_server.url, timeout=60) as http:
        assert wait_for(lambda: metric(http, "inferd:num_requests_running") == 0, timeout=60)
        assert metric(http, "inferd:kv_cache_usage_perc") == 0.0

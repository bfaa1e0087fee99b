"""A real `inferd serve --data-parallel-size 2` (two engine core processes, one thread each):
requests are served by both, /metrics has a series per replica, a replica killed mid-stream fails
only its own requests (an error event, then [DONE]) while /health stays green, and when the last
one dies the streams in flight get their error and the server exits with status 1, leaving no
process behind. Plus the in-process engine (`--no-engine-core-process`) still serving, and
`--stream-interval` honoured on both paths."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import httpx
import psutil
import pytest
from server_helpers import metric, start_server, wait_for

pytestmark = pytest.mark.slow

FLAGS = ("--kv-cache-memory", "96MiB", "--max-num-batched-tokens", "256",
         "--max-model-len", "1024")  # fmt: skip


def stream(url: str, prompt: list[int], max_tokens: int, events: list) -> None:
    """Stream a completion, appending each SSE data payload to `events` (in a thread)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}  # fmt: skip
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    events.append(line[5:].strip())
    except httpx.HTTPError as e:
        events.append(f"transport error: {e}")


def core_pids(server) -> list[int]:
    found = re.search(r"engine core processes: ([\d, ]+)", server.log.read_text())
    return [int(p) for p in found.group(1).split(", ")]


def test_replicas_serve_and_one_that_dies_fails_alone_then_the_last_ends_the_server():
    server = start_server(*FLAGS, "--data-parallel-size", "2",
                          "--data-parallel-routing", "round-robin")  # fmt: skip
    try:
        pids = core_pids(server)
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
        with httpx.Client(base_url=server.url, timeout=120) as http:
            for i in range(4):
                r = http.post("/v1/completions", json={"prompt": [2, 100 + i, 7], "max_tokens": 3})
                assert r.status_code == 200, r.text
            for engine in ("0", "1"):
                assert metric(http, "inferd:generation_tokens_total", engine=engine) == 6
            # Four long streams, two per replica; replica 1 is killed under them.
            events = [[] for _ in range(4)]
            threads = [threading.Thread(target=stream, args=(server.url, [2, 50 + i], 120, e))
                       for i, e in enumerate(events)]  # fmt: skip
            for t in threads:
                t.start()
            assert wait_for(lambda: all(len(e) >= 3 for e in events), 120)
            os.kill(pids[1], signal.SIGKILL)
            for t in threads:
                t.join(120)
            failed = [e for e in events if '"error"' in e[-2]]
            served = [e for e in events if '"error"' not in e[-2]]
            assert len(failed) == 2 and len(served) == 2
            assert all(json.loads(e[-2])["choices"][0]["finish_reason"] == "length"
                       for e in served)  # fmt: skip
            assert all(e[-1] == "[DONE]" for e in events)
            assert all("engine core 1 exited" in e[-2] for e in failed)
            assert http.get("/health").status_code == 200  # replica 0 still serves
            r = http.post("/v1/completions", json={"prompt": [2, 9], "max_tokens": 2})
            assert r.status_code == 200
            # The last replica dies under a stream: it gets its error, the server exits 1.
            last: list = []
            thread = threading.Thread(target=stream, args=(server.url, [2, 77], 120, last))
            thread.start()
            assert wait_for(lambda: len(last) >= 3, 120)
            os.kill(pids[0], signal.SIGKILL)
            thread.join(120)
            assert '"error"' in last[-2] and last[-1] == "[DONE]"
        assert server.proc.wait(60) == 1
        assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                       for p in pids)  # fmt: skip
    finally:
        server.stop()


def check_stream_interval(http, url: str) -> None:
    """Served with --stream-interval 4: 10 tokens stream as the first one, then 4 at a time
    (the last event with the finish), and add up to the plain completion's text."""
    prompt = [2, 100, 7]
    body = {"prompt": prompt, "max_tokens": 10, "temperature": 0, "ignore_eos": True}
    plain = http.post("/v1/completions", json=body)
    assert plain.status_code == 200, plain.text
    events: list = []
    stream(url, prompt, 10, events)
    choices = [json.loads(e)["choices"] for e in events[:-1]]
    texts = [c[0]["text"] for c in choices if c]
    assert events[-1] == "[DONE]" and 2 <= len(texts) <= 4  # tokens 1, 5, 9 and 10
    assert "".join(texts) == plain.json()["choices"][0]["text"]


def test_the_in_process_engine_still_serves():
    server = start_server(*FLAGS, "--no-engine-core-process", "--stream-interval", "4")
    try:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            r = http.post("/v1/completions", json={"prompt": "The capital of France is",
                                                   "max_tokens": 4, "temperature": 0})  # fmt: skip
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
            assert metric(http, "inferd:generation_tokens_total", engine="0") == 4
            check_stream_interval(http, server.url)
        assert "engine core processes" not in server.log.read_text()
    finally:
        server.stop()


def test_the_core_process_streams_at_its_interval():
    server = start_server(*FLAGS, "--stream-interval", "4")
    try:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            check_stream_interval(http, server.url)
    finally:
        server.stop()
    time.sleep(0.1)

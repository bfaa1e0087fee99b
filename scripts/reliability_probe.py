"""Hostile and unlucky cases against a real `inferd serve` (default flags), timed: a 100,000-prompt
request, a 10 MiB prompt, invalid Unicode, a reserved template variable, /health meanwhile,
SIGTERM, then 64 MiB of random bytes written into the converted-weights cache and a restart.

    INFERD_CACHE=/tmp/scratch-cache python scripts/reliability_probe.py

It damages the cache it is given on purpose, so it refuses to run without an explicit
INFERD_CACHE (use a scratch directory). tests/reliability asserts the same cases.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

PORT = int(os.environ.get("PROBE_PORT", "8077"))
URL = f"http://127.0.0.1:{PORT}"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def start() -> tuple[subprocess.Popen, float]:
    cmd = [sys.executable, "-m", "inferd", "serve", "--port", str(PORT), "--quiet"]
    log = open("/tmp/reliability_probe.log", "ab")  # noqa: SIM115 - the server's lifetime
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    t0 = time.monotonic()
    while proc.poll() is None:
        try:
            if httpx.get(URL + "/health", timeout=1).status_code == 200:
                return proc, time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    sys.exit(f"inferd serve exited {proc.returncode}: see /tmp/reliability_probe.log")


def timed(path: str, **kw) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    r = httpx.post(URL + path, timeout=300, **kw)
    return r, time.monotonic() - t0


def watch_health(stop: threading.Event, latencies: list[float]) -> None:
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            httpx.get(URL + "/health", timeout=30)
        except httpx.HTTPError:
            pass
        latencies.append(time.monotonic() - t0)
        time.sleep(0.1)


def stop_server(proc: subprocess.Popen) -> float:
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    return time.monotonic() - t0


def main() -> None:
    cache = os.environ.get("INFERD_CACHE")
    if not cache:
        sys.exit("set INFERD_CACHE to a scratch directory: this probe damages the cache on purpose")
    proc, ready = start()
    print(f"ready in {ready:.1f} s")
    stop, latencies = threading.Event(), []
    watcher = threading.Thread(target=watch_health, args=(stop, latencies))
    watcher.start()
    cases = [
        ("100k prompts", "/v1/completions", {"prompt": [[2, 818]] * 100000, "max_tokens": 1}),
        ("10 MiB prompt", "/v1/completions",
         {"prompt": "hello world " * (10 * 1024 * 1024 // 12), "max_tokens": 1}),
        ("chat_template_kwargs self", "/v1/chat/completions",
         {**CHAT, "chat_template_kwargs": {"self": 1}}),
    ]  # fmt: skip
    for name, path, body in cases:
        r, s = timed(path, json=body)
        print(f"{name}: {r.status_code} in {s:.2f} s: {r.text[:160]}")
    raw = '{"prompt": "a\\ud800b", "max_tokens": 1}'  # a lone surrogate, as raw JSON
    r, s = timed("/v1/completions", content=raw, headers={"content-type": "application/json"})
    print(f"lone surrogate: {r.status_code} in {s:.2f} s: {r.text[:160]}")
    stop.set()
    watcher.join()
    print(f"/health: worst {max(latencies):.2f} s over {len(latencies)} probes meanwhile")
    seconds = stop_server(proc)
    print(f"SIGTERM, idle: exited {proc.returncode} in {seconds:.1f} s")

    entries = sorted(Path(cache, "weights").glob("*.safetensors"), key=lambda p: p.stat().st_size)
    target = entries[-1]
    with open(target, "r+b") as f:
        f.seek(target.stat().st_size // 2)
        f.write(os.urandom(64 << 20))
    proc, ready = start()
    body = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    answer = timed("/v1/completions", json=body)[0].json()["choices"][0]["text"]
    print(f"damaged weight cache ({target.name}, 64 MiB of random bytes): ready in {ready:.1f} s, "
          f"answer {json.dumps(answer)}")  # fmt: skip
    stop_server(proc)


if __name__ == "__main__":
    main()

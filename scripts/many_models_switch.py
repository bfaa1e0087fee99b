"""Switching time: two models (the embedded Gemma 3 270M and smollm2-135m-instruct, from
`inferd pull`) behind one `inferd serve` with --max-loaded-models 1, alternating requests; prints
each model's texts, the times, /v1/models and the model_* series of /metrics (docs/server.md,
Many models). Run: .venv/bin/python scripts/many_models_switch.py"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

PORT = 8765
PROMPT = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}


def call(path: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body else None
    request = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=data,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=300) as reply:
        return json.loads(reply.read())


def main() -> None:
    cmd = [sys.executable, "-m", "inferd.cli", "serve", "--port", str(PORT),
           "--model", "gemma=gemma-3-270m", "--model", "chat=smollm2-135m-instruct",
           "--max-loaded-models", "1"]  # fmt: skip
    server = subprocess.Popen(cmd)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        texts: dict[str, set] = {}
        times: dict[str, list] = {"gemma": [], "chat": []}
        for model in ["gemma", "chat"] * 3:  # every request switches
            start = time.perf_counter()
            reply = call("/v1/completions", {"model": model, **PROMPT})
            times[model].append(round(time.perf_counter() - start, 2))
            texts.setdefault(model, set()).add(reply["choices"][0]["text"])
        start = time.perf_counter()
        call("/v1/completions", {"model": "chat", **PROMPT})
        print("texts:", {k: sorted(v) for k, v in texts.items()})
        print("switch + request, s:", times)
        print("the loaded model again, s:", round(time.perf_counter() - start, 2))
        print(json.dumps(call("/v1/models"), indent=1))
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics").read().decode()
        print("\n".join(x for x in metrics.splitlines() if x.startswith("inferd:model_")))
    finally:
        server.terminate()
        server.wait(60)


if __name__ == "__main__":
    main()

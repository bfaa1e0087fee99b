"""`inferd serve --ray` as a user runs it: it starts a Ray cluster of its own, serves on
--host/--port once the replica has loaded the model, and on SIGINT deletes the application,
stops the cluster and exits 0, leaving no Ray process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest
from ray_helpers import START_TIMEOUT_S, free_port, ray_processes, samples, stop_leftovers, wait_for

pytest.importorskip("ray.serve")

pytestmark = pytest.mark.slow


def test_inferd_serve_ray_starts_serves_and_stops_its_cluster():
    before = ray_processes()
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="inferd-ray-cli-", suffix=".log")[1])
    cmd = [sys.executable, "-m", "inferd", "serve", "--ray", "--num-replicas", "1",
           "--port", str(port), "--kv-cache-memory", "48MiB", "--max-model-len", "512",
           "--threads", "1", "--disable-log-requests"]  # fmt: skip
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:

        def healthy() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                return httpx.get(url + "/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_for(healthy, START_TIMEOUT_S, 0.5), log.read_text()[-3000:]
        r = httpx.post(url + "/v1/completions", timeout=120,
                       json={"prompt": "The capital of France is", "max_tokens": 4})  # fmt: skip
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        text = httpx.get(url + "/metrics").text
        assert samples(text, "inferd:engine_replicas") == [
            ({"model_name": "gemma-3-270m", "state": "healthy"}, 1.0),
            ({"model_name": "gemma-3-270m", "state": "unhealthy"}, 0.0),
        ]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
        assert "serving on http://127.0.0.1" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        log.unlink(missing_ok=True)
        left = stop_leftovers(before, timeout=30)
    assert not left, f"Ray processes outlived inferd serve --ray (killed now): {left}"

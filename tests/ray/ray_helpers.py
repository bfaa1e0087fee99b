"""Helpers for the Ray tests: a two-node Ray cluster on loopback that starts and stops with the
tests and leaves no process behind, `inferd serve` as the reference server, /metrics samples."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

START_TIMEOUT_S = 240  # model loads on a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of metric `name` in a /metrics body, with its labels."""
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out.append((s.labels, s.value))
    return out


def ray_processes() -> set[int]:
    """Processes Ray runs (its daemons and workers), by their command lines."""
    marks = ("raylet", "gcs_server", "ray::", "default_worker.py", "ray/dashboard",
             "log_monitor.py", "runtime_env/agent", "ray/autoscaler")  # fmt: skip
    found = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        line = " ".join(p.info["cmdline"] or ())
        if any(m in line for m in marks):
            found.add(p.info["pid"])
    return found


def stop_leftovers(before: set[int], timeout: float = 20.0) -> list[str]:
    """Ray processes started since `before` that outlive the cluster: killed, and named."""
    if wait_for(lambda: not (ray_processes() - before), timeout):
        return []
    named = []
    for pid in ray_processes() - before:
        try:
            p = psutil.Process(pid)
            named.append(" ".join(p.cmdline())[:120])
            p.kill()
        except psutil.Error:
            pass
    return named


class ReferenceServer:
    """`inferd serve FLAGS` on a free port: what the Ray endpoint must answer alike."""

    def __init__(self, flags: list[str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(tempfile.mkstemp(prefix="inferd-ref-", suffix=".log")[1])
        cmd = [sys.executable, "-m", "inferd", "serve", "--port", str(self.port), *flags]
        env = {k: v for k, v in os.environ.items() if k != "INFERD_API_KEY"}
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"inferd serve exited:\n{self.log.read_text()[-3000:]}")
            try:
                return httpx.get(self.url + "/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        if not wait_for(up, START_TIMEOUT_S, 0.5):
            raise RuntimeError(f"inferd serve not ready:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.log.unlink(missing_ok=True)

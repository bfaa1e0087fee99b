"""Helpers for the black-box server tests: spawn `inferd serve` on a free loopback port, wait
until it is healthy, always reap it; read /metrics samples."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

API_KEY = "test-key-7f3a"
MAX_REQUEST_BYTES = 64 * 1024
START_TIMEOUT_S = 240  # model load under a loaded 2-core machine
# The default mode (GGUF blocks, C kernels): what `inferd serve` runs by default, and on this
# machine ~3x faster to load and ~7x faster to decode than float32 (the HF parity mode, which
# tests/parity covers).
BASE_FLAGS = ["--dtype", "auto", "--kv-cache-memory", "256MiB",
              "--max-num-batched-tokens", "512"]  # fmt: skip


def _die_with_parent() -> None:
    """Linux: the server gets SIGTERM if pytest itself is killed, so none is left behind."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, *flags: str, api_key: str | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.log = Path(tempfile.mkstemp(prefix="inferd-serve-", suffix=".log")[1])
        env = {k: v for k, v in os.environ.items() if k != "INFERD_API_KEY"}
        cmd = [sys.executable, "-m", "inferd", "serve", "--port", str(self.port), *flags]
        if api_key:
            cmd += ["--api-key", api_key]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         preexec_fn=_die_with_parent)  # fmt: skip

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"inferd serve exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"inferd serve not healthy after {START_TIMEOUT_S} s:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        self.log.unlink(missing_ok=True)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def start_server(*flags: str, api_key: str | None = None) -> ServerProcess:
    server = ServerProcess(*BASE_FLAGS, *flags, api_key=api_key)
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


def metric(http: httpx.Client, name: str, **labels: str) -> float:
    """One sample of /metrics (labels: those that must match; model_name is implied)."""
    text = http.get("/metrics").text
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0  # a labelled counter that has not been incremented yet has no sample


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()

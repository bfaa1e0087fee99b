"""Helpers for the reliability tests that run a real `inferd serve`: a watch that probes
/health throughout a test, and the flags of the server with small limits."""

from __future__ import annotations

import threading
import time

import httpx

# Small on purpose: every limit is reached in seconds. `--dtype auto` (the blocks mode) is what
# a damaged converted-weights cache would feed (test_damaged_cache_server.py compares with it).
LIMITED_FLAGS = ("--dtype", "auto", "--max-model-len", "1024", "--max-num-seqs", "8",
                 "--max-queued-requests", "1", "--max-queued-tokens", "4096",
                 "--max-prompts-per-request", "16", "--max-num-batched-tokens", "64")  # fmt: skip


class HealthWatch:
    """Polls /health every `every_s` from a thread; `worst()` is the slowest answer (seconds)
    and `failures` the answers that were not 200 (or never came within 1 s)."""

    def __init__(self, url: str, every_s: float = 0.2):
        self.url, self.every_s = url, every_s
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=1.0) as http:
            while not self._stop.is_set():
                self.probe(http)
                self._stop.wait(self.every_s)

    def probe(self, http: httpx.Client) -> None:
        start = time.monotonic()
        try:
            status = http.get("/health").status_code
        except httpx.HTTPError as e:
            status = f"{type(e).__name__}"
        self.latencies.append(time.monotonic() - start)
        if status != 200:
            self.failures.append(str(status))

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)
        with httpx.Client(base_url=self.url, timeout=1.0) as http:
            self.probe(http)  # and once more at the end, however short the test was

    def worst(self) -> float:
        return max(self.latencies, default=0.0)

    def assert_healthy(self) -> None:
        assert self.latencies, "the watch never probed"
        assert not self.failures, self.failures
        assert self.worst() < 1.0, f"/health took {self.worst():.2f} s"

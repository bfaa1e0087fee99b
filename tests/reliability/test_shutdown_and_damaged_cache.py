"""Two real servers of their own. One is stopped with SIGTERM while two streams run: it refuses
new requests (503) and reports itself unhealthy, lets the short stream finish, ends the long one
at --shutdown-timeout with an error event and [DONE], and exits with status 0 and no traceback.
The other starts on a cache whose converted weights, tokenizer and kernels were damaged: it logs
each damaged file, rebuilds it, answers exactly like a server on an intact cache, and then
takes a SIGINT with a stream running the same way."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from reliability_helpers import LIMITED_FLAGS
from server_helpers import start_server

from inferd import cache
from inferd.loader import weight_cache

pytestmark = pytest.mark.slow

PROMPT = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}


class Stream(threading.Thread):
    """A streamed completion read line by line; `events` are its data payloads."""

    def __init__(self, url: str, max_tokens: int):
        super().__init__(daemon=True)
        self.url, self.max_tokens = url, max_tokens
        self.events: list[str] = []
        self.first = threading.Event()

    def run(self) -> None:
        body = {"prompt": "Tell me a story.", "max_tokens": self.max_tokens,
                "ignore_eos": True, "stream": True}  # fmt: skip
        with httpx.Client(base_url=self.url, timeout=120) as http:
            with http.stream("POST", "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[len("data: ") :])
                        self.first.set()

    def finish_reason(self) -> str | None:
        chunks = [json.loads(e) for e in self.events if e != "[DONE]"]
        reasons = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
        return next((r for r in reasons if r), None)

    def error(self) -> dict | None:
        chunks = [json.loads(e) for e in self.events if e != "[DONE]"]
        return next((c["error"] for c in chunks if "error" in c), None)


def stop_with(server, sig: signal.Signals, long: Stream, timeout_s: float) -> float:
    """Send `sig`, check the drain from outside, return the seconds until the process exited."""
    sent = time.monotonic()
    os.kill(server.proc.pid, sig)
    time.sleep(0.3)
    with httpx.Client(base_url=server.url, timeout=5) as http:
        assert http.get("/health").status_code == 503
        refused = http.post("/v1/completions", json=PROMPT)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        assert int(refused.headers["Retry-After"]) >= 1
    assert server.proc.wait(timeout_s + 30) == 0
    long.join(10)
    assert long.events[-1] == "[DONE]"
    error = long.error()
    assert error is not None and error["code"] == "shutting_down", long.events[-3:]
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log and "Exception in ASGI" not in log
    return time.monotonic() - sent


def test_sigterm_drains_then_ends_what_is_left():
    server = start_server(*LIMITED_FLAGS, "--shutdown-timeout", "6")
    try:
        long, short = Stream(server.url, 1000), Stream(server.url, 3)
        long.start()
        assert long.first.wait(120)
        short.start()
        assert short.first.wait(120)
        seconds = stop_with(server, signal.SIGTERM, long, 6)
        short.join(10)
        assert short.events[-1] == "[DONE]" and short.finish_reason() == "length"
        assert short.error() is None
        assert seconds >= 5  # the long stream had its --shutdown-timeout
    finally:
        server.stop()


def _entries_in_use() -> list[Path]:
    """The converted weights, tokenizer and kernel library a server on the embedded model
    loads from the cache (other tests leave other entries beside them)."""
    from inferd.cpu_kernels.build import current_kernels
    from inferd.loader import gguf_cache
    from inferd.loader.default_model import default_model_path
    from inferd.loader.gguf_file import GGUFFile
    from inferd.tokenizer.gguf_vocab import GGUFVocab

    model = default_model_path()
    gguf = GGUFFile(model)
    vocab = GGUFVocab.from_metadata(gguf.metadata, gguf.architecture)
    return [
        weight_cache.entry_path(model, gguf_cache.MODE, 0, 1),
        cache.cache_dir() / "tokenizers" / f"{vocab.cache_key()}.bpe",  # the compact tokenizer
        current_kernels().path,
    ]


def _damaged_copy(source: Path, target: Path) -> list[Path]:
    """A copy of the warm cache with the entries a server loads damaged; those files."""
    for kind in ("kernels", "tokenizers", "weights"):
        shutil.copytree(source / kind, target / kind)
    (target / "models").mkdir()
    for path in (source / "models").iterdir():  # the model itself: shared, not copied
        if path.suffix == ".gguf":
            (target / "models" / path.name).symlink_to(path.resolve())
        else:
            shutil.copy2(path, target / "models" / path.name)
    weights, tokenizer, kernels = (target / p.relative_to(source) for p in _entries_in_use())
    with open(weights, "r+b") as f:  # the case: 64 MiB of random bytes
        f.seek(1 << 20)
        f.write(os.urandom(64 << 20))
    with open(tokenizer, "r+b") as f:
        f.truncate(f.seek(0, 2) // 2)
    with open(kernels, "r+b") as f:  # a broken ELF header
        f.write(b"\0" * 64)
    return [weights, tokenizer, kernels]


def test_a_damaged_cache_is_rebuilt_and_the_answer_is_right(limited_http, tmp_path, monkeypatch):
    reference = limited_http.post("/v1/completions", json=PROMPT).json()["choices"][0]["text"]
    damaged = _damaged_copy(cache.cache_dir(), tmp_path / "cache")
    monkeypatch.setenv("INFERD_CACHE", str(tmp_path / "cache"))
    server = start_server(*LIMITED_FLAGS, "--shutdown-timeout", "1")
    try:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            answer = http.post("/v1/completions", json=PROMPT).json()["choices"][0]["text"]
        assert answer == reference
        log = server.log.read_text(errors="replace")
        for path in damaged:
            assert f"cache entry {path} is damaged" in log, path.name
        weights, *others = damaged  # rebuilt, each with its checksum
        assert weight_cache.map_entry(weights) is not None
        assert all(cache.verified(path) for path in others)
        long = Stream(server.url, 1000)
        long.start()
        assert long.first.wait(120)
        stop_with(server, signal.SIGINT, long, 1)
    finally:
        server.stop()

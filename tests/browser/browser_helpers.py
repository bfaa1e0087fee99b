"""What the browser tests share: the server's flags and key, where Chromium is, a tab that
records its errors, a load of concurrent completions (the fixtures are in conftest.py)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))

from server_helpers import ServerProcess  # noqa: E402

API_KEY = "browser-key-5c1e"
# Flags no browser test needs are left at their defaults (the machine's default weight mode).
SERVER_FLAGS = ["--kv-cache-memory", "48MiB", "--max-num-seqs", "16", "--max-num-batched-tokens",
                "256", "--enable-request-timeline", "--disable-log-requests"]  # fmt: skip
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def chromium() -> str | None:
    given = os.environ.get("INFERD_CHROMIUM")
    if given:
        return given
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    """A tab, with what went wrong in it: console errors and uncaught exceptions."""

    def __init__(self, context, url: str, key: str | None = None):
        """`key`: the API key already given in this tab's session (as after a reload), so the
        page loads without asking for it."""
        self.page = context.new_page()
        self.errors: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        if key is not None:  # where common.js keeps it
            self.page.add_init_script(f"sessionStorage.setItem('inferd.apiKey', {json.dumps(key)})")
        self.page.goto(url)

    def js(self, expression: str):
        # NOTE: page.evaluate, not wait_for_function: the pages' Content-Security-Policy forbids
        # the eval that playwright's in-page polling uses.
        return self.page.evaluate(expression)

    def wait(self, expression: str, timeout: float = 120.0, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.js(expression):
                return
            time.sleep(0.1)
        raise AssertionError(f"not within {timeout:.0f} s: {what or expression}")

    def enter_key(self, key: str) -> None:
        self.page.wait_for_selector("#key-dialog[open]", timeout=30_000)
        self.page.fill("#key-input", key)
        self.page.click("#key-ok")

    def close(self) -> None:
        self.page.close()


class Load:
    """`n` completions sent at once from threads; prompts share a two-block prefix (prefix-cache
    sharing shows) and differ in length (prefills of different sizes)."""

    SHARED = "In a paged KV cache, every request owns a table of fixed-size blocks. "

    def __init__(self, server: ServerProcess, n: int = 16, max_tokens: int = 16):
        self.server, self.max_tokens = server, max_tokens
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self._one, args=(i,), daemon=True)
                        for i in range(n)]  # fmt: skip
        for t in self.threads:
            t.start()

    def _one(self, i: int) -> None:
        body = {"prompt": self.SHARED + f"Request {i} asks about memory. " * (1 + i % 4),
                "max_tokens": self.max_tokens, "ignore_eos": True, "temperature": 0}  # fmt: skip
        try:
            r = httpx.post(self.server.url + "/v1/completions", json=body,
                           headers=self.server.headers(), timeout=600)  # fmt: skip
            r.raise_for_status()
        except httpx.HTTPError as e:
            self.failures.append(f"request {i}: {e}")

    def join(self) -> None:
        for t in self.threads:
            t.join(600)
        assert self.failures == []

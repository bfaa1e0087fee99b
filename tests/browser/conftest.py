"""A real browser on the pages of a real `inferd serve`: Python playwright driving Debian's
Chromium (`apt-get install -y chromium`; `playwright install` cannot download browsers here).
Without a Chromium the tests skip, saying so. Screenshots go to $INFERD_SCREENSHOT_DIR when set
(CI keeps them; docs/img/ holds the ones the README shows), else to a temporary folder."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

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


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    path = chromium()
    if path is None:
        pytest.skip("no Chromium here: apt-get install -y chromium (or set INFERD_CHROMIUM)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=path,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1280, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture(scope="session")
def served():
    """The embedded model behind an API key, with a small KV pool (the blocks visibly fill) and
    request timelines on (the chat page shows each reply's)."""
    server = ServerProcess(*SERVER_FLAGS, api_key=API_KEY)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory) -> Path:
    folder = os.environ.get("INFERD_SCREENSHOT_DIR")
    path = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


class Page:
    """A tab, with what went wrong in it: console errors and uncaught exceptions."""

    def __init__(self, context, url: str):
        self.page = context.new_page()
        self.errors: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
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

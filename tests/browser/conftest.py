"""A real browser on the pages of a real `inferd serve`: Python playwright driving Debian's
Chromium (`apt-get install -y chromium`; `playwright install` cannot download browsers here).
Without a Chromium the tests skip, saying so. Screenshots go to $INFERD_SCREENSHOT_DIR when set
(CI keeps them; docs/img/ holds the ones the README shows), else to a temporary folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from browser_helpers import API_KEY, CHROMIUM_FLAGS, SERVER_FLAGS, ServerProcess, chromium


@pytest.fixture(scope="module")
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


@pytest.fixture(scope="module")
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

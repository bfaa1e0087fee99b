"""The pages declare their icon, so Chromium never asks for /favicon.ico (a 404, and an error in
its console on every page load). Headless Chromium fetches icons outside the page, where neither
its console nor playwright's request events see them, so the server side records every path
asked: the dashboard's app over a scripted engine client (no model, seconds)."""

from __future__ import annotations

import threading
import time

import uvicorn
from browser_helpers import API_KEY, Page
from fake_client import ScriptedClient
from server_helpers import free_port

from inferd.server.app import ServerSettings, create_app

ICON = "/dashboard/static/favicon.svg"


class AskedPaths:
    """ASGI middleware: the path and status of every HTTP request the app answered."""

    def __init__(self, app):
        self.app, self.answered = app, []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def recording(message):
            if message["type"] == "http.response.start":
                self.answered.append((scope["path"], message["status"]))
            await send(message)

        await self.app(scope, receive, recording)


def test_chromium_fetches_the_declared_icon_and_never_favicon_ico(browser):
    app = AskedPaths(create_app(ScriptedClient(), ServerSettings(api_key=API_KEY)))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        for page in ("/", "/dashboard"):
            tab = Page(browser, f"http://127.0.0.1:{port}{page}")
            try:
                # NOTE: Chromium keeps an icon it fetched: a later page with the same icon asks
                # for none, so each page gets a few seconds for an ask that may not come.
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline and "/favicon.ico" not in _paths(app):
                    time.sleep(0.05)
            finally:
                tab.close()
        assert "/favicon.ico" not in _paths(app), app.answered
        assert (ICON, 200) in app.answered, app.answered  # the icon the pages declare
        assert not [a for a in app.answered if a[1] == 404], app.answered
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _paths(app: AskedPaths) -> set[str]:
    return {path for path, _ in app.answered}

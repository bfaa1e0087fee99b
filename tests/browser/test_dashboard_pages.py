"""The dashboard and the chat page in Chromium against a real server on the embedded model: the
key prompt, no console errors (on load, and throughout), the KV blocks filling and emptying
while 16 requests run, a finished request's timeline, a streamed chat answer with its panel;
screenshots of both pages taken under that load."""

from __future__ import annotations

import re

import pytest
from browser_helpers import API_KEY, Load, Page

pytestmark = pytest.mark.slow

USED_BLOCKS = "[...document.querySelectorAll('.kv-group')].reduce((n, g) => n + +g.dataset.used, 0)"
UPDATES = "+(document.body.dataset.updates || 0)"
CHAT_LIVE = "document.getElementById('status').dataset.state === 'live'"
ICON_FETCH = """fetch(document.querySelector('link[rel=icon]').href)
  .then(r => [r.status, r.headers.get('content-type')])"""
PARTIALS_RECORDER = """() => {
  window.partials = [];
  new MutationObserver(() => {
    const reply = [...document.querySelectorAll('.message.assistant')].pop();
    if (reply && reply.dataset.state === 'streaming')
      window.partials.push(reply.querySelector('.text').textContent);
  }).observe(document.body, { childList: true, characterData: true, subtree: true });
}"""


def test_the_key_prompt_refuses_a_wrong_key_then_the_dashboard_goes_live(browser, served):
    tab = Page(browser, served.url + "/dashboard")
    try:
        tab.enter_key("not-the-key")
        tab.page.wait_for_selector("#key-dialog[open]", timeout=30_000)  # asked again
        assert "refused" in tab.page.text_content("#key-message")
        assert tab.js(UPDATES) == 0
        tab.errors.clear()  # Chromium logs each 401 answer as a failed resource load
        tab.page.fill("#key-input", API_KEY)
        tab.page.click("#key-ok")
        tab.wait(f"{UPDATES} >= 2", what="two snapshots drawn")
        assert tab.js("document.getElementById('status').dataset.state") == "live"
        assert tab.js("document.querySelectorAll('.kv-group').length") == 2  # full + sliding
        assert "sliding window of 512 tokens" in tab.page.text_content("#kv-groups")
        assert tab.js(USED_BLOCKS) == 0
        assert tab.errors == []
    finally:
        tab.close()


def test_the_pages_load_with_no_console_error(browser, served):
    """Opened with the key already given, each page goes live with nothing in the console; its
    declared icon is served (without one Chromium asks for /favicon.ico, a 404; headless
    Chromium fetches icons outside the page, so test_page_icon.py watches the server for it)."""
    for path, live in (("/", CHAT_LIVE), ("/dashboard", f"{UPDATES} >= 2")):
        tab = Page(browser, served.url + path, key=API_KEY)
        try:
            tab.wait(live, what=f"{path} live")
            icon = tab.js(ICON_FETCH)
            assert icon == [200, "image/svg+xml"], (path, icon)
            assert tab.errors == [], (path, tab.errors)
        finally:
            tab.close()


def test_both_pages_under_a_16_request_load(browser, served, screenshots):
    dashboard = Page(browser, served.url + "/dashboard")
    chat = Page(browser, served.url + "/")
    try:
        for tab in (dashboard, chat):
            tab.enter_key(API_KEY)
        dashboard.wait(f"{UPDATES} >= 1")
        chat.wait(CHAT_LIVE, what="chat ready")
        dashboard.errors.clear(), chat.errors.clear()  # the 401s before the key was entered

        load = Load(served, n=16, max_tokens=24)
        chat.page.fill("#max_tokens", "16")
        chat.page.fill("#prompt", "Explain in one sentence what a KV cache stores.")
        # The page records the reply's text at each change while it streams: polling from here
        # can miss the whole stream on a fast machine.
        chat.js(PARTIALS_RECORDER)
        chat.page.click("#send")
        dashboard.wait(
            f"{USED_BLOCKS} > 0 && document.querySelectorAll('#requests .request-row').length >= 2",
            what="KV blocks in use by requests",
        )
        dashboard.page.screenshot(path=str(screenshots / "dashboard.png"), full_page=True)
        reply = "[...document.querySelectorAll('.message.assistant')].pop()"
        chat.wait(f"{reply}.dataset.state !== 'streaming'", timeout=300, what="reply done")
        assert chat.js(f"{reply}.dataset.state") == "done"
        text = chat.js(f"{reply}.querySelector('.text').textContent")
        partial = chat.js("window.partials")  # the reply's text while it was still streaming
        assert any(0 < len(p) < len(text) and text.startswith(p) for p in partial), partial
        panel = chat.page.text_content(".message.assistant details")
        assert "TTFT" in panel and "tok/s" in panel and "engine: queued" in panel
        assert int(re.search(r"(\d+) chunks", panel).group(1)) >= 2
        assert chat.js(f"{reply}.querySelectorAll('.bar .seg-decode').length") == 1
        chat.page.screenshot(path=str(screenshots / "chat.png"))
        load.join()

        dashboard.wait(f"{USED_BLOCKS} === 0", what="every block released")
        dashboard.wait("document.querySelectorAll('#recent .request-row').length >= 12")
        cached = dashboard.js("[...document.querySelectorAll('.kv-group')].map(g => +g.dataset."
                              "cached)")  # fmt: skip
        assert min(cached) > 0  # the finished requests' full blocks stay for prefix reuse
        row = "document.querySelector('#recent .request-row')"
        segments = dashboard.js(f"[...{row}.querySelectorAll('.seg')].map(s => s.className)")
        assert segments[:3] == ["seg seg-queued", "seg seg-prefill", "seg seg-decode"]
        assert "TTFT" in dashboard.js(f"{row}.textContent")
        # the steps against the machine's limits: rates always, MBU / MFU once peaks are known
        efficiency = dashboard.page.text_content("#efficiency-summary")
        assert "decode:" in efficiency and "B/s read" in efficiency, efficiency
        assert "MBU" in efficiency  # a figure, or why it is unknown
        assert dashboard.errors == [] and chat.errors == []
    finally:
        dashboard.close()
        chat.close()

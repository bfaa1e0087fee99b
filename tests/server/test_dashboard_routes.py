"""The dashboard's routes without a model (milliseconds): the pages open and their data behind the
API key, snapshots capped to a few a second and shared by every page, finished requests
recorded only once someone watches, the event stream, and what a client without snapshots or a
dead engine answers."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from fake_client import ScriptedClient
from starlette.testclient import TestClient

from inferd.engine_snapshot import (
    Counters,
    EngineSettings,
    EngineSnapshot,
    KVGroupSnapshot,
    MemorySnapshot,
)
from inferd.errors import EngineDeadError
from inferd.outputs import CompletionOutput, RequestMetrics, RequestOutput
from inferd.server.app import ServerSettings, create_app
from inferd.server.dashboard.sampler import DashboardSampler, RecentRequests

KEY = "dash-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def fake_snapshot(steps: int = 0) -> EngineSnapshot:
    settings = EngineSettings("fake-model", "cpu", "float32", 256, 4, 64, 16, True)
    group = KVGroupSnapshot(None, 2, 1024, "-uuc.", {"r-0": [1, 2]})
    return EngineSnapshot(1.0, settings, [group], [], 0, 0, Counters(0, 0, 0, 0, 0, steps), [],
                          {}, MemorySnapshot("cpu", 100, 200))  # fmt: skip


class WatchedClient(ScriptedClient):
    """The scripted client, with output observers and snapshots (counting how many were built)."""

    def __init__(self, dead: bool = False):
        super().__init__()
        self.observers: list = []
        self.snapshots = 0
        self.dead = dead

    def observe_outputs(self, callback):
        self.observers.append(callback)

    async def add_request(self, request_id, prompt, params, outputs, arrival_time=None):
        await super().add_request(request_id, prompt, params, _Tee(outputs, self.observers),
                                  arrival_time)  # fmt: skip

    async def snapshot(self) -> EngineSnapshot:
        if self.dead:
            raise EngineDeadError("the engine loop died: boom")
        self.snapshots += 1
        await asyncio.sleep(0)
        return fake_snapshot(self.snapshots)


class _Tee:
    """A request's output queue that shows every output to the observers first, as the engine
    client does."""

    def __init__(self, queue: asyncio.Queue, observers: list):
        self.queue, self.observers = queue, observers

    def put_nowait(self, out) -> None:
        for observe in self.observers:
            observe(out)
        self.queue.put_nowait(out)


def app_of(client=None, **settings):
    return create_app(client or WatchedClient(), ServerSettings(api_key=KEY, **settings))


def test_pages_are_open_and_their_data_needs_the_key():
    with TestClient(app_of()) as http:
        for path, kind in (("/", "text/html"), ("/dashboard", "text/html"),
                           ("/dashboard/static/dashboard.js", "text/javascript"),
                           ("/dashboard/static/style.css", "text/css")):  # fmt: skip
            r = http.get(path)
            assert r.status_code == 200 and r.headers["content-type"].startswith(kind), path
            assert "default-src 'self'" in r.headers["content-security-policy"]
            assert r.headers["x-content-type-options"] == "nosniff"
        assert "<title>inferd · chat</title>" in http.get("/").text
        assert http.head("/dashboard").status_code == 200
        for path in ("/dashboard/snapshot", "/dashboard/events"):
            assert http.get(path).status_code == 401
        assert http.get("/dashboard/snapshot", headers=AUTH).status_code == 200
        assert http.get("/dashboard/snapshot", headers={"x-api-key": KEY}).status_code == 200
        # Only shipped files; nothing reaches the data routes through the open prefix.
        assert http.get("/dashboard/static/nope.js").status_code == 404
        assert http.get("/dashboard/static/..%2Fsnapshot").status_code == 404
        assert http.get("/dashboard/static/../snapshot").status_code == 401  # normalised


def test_every_page_asset_it_references_is_shipped():
    with TestClient(app_of()) as http:
        for page in ("/", "/dashboard"):
            html = http.get(page).text
            assets = [part.split('"')[0] for part in html.split('="/dashboard/static/')[1:]]
            assert assets, page
            for name in assets:
                assert http.get("/dashboard/static/" + name).status_code == 200, name
            assert "<script>" not in html and "style=" not in html  # nothing inline (CSP)


def test_the_pages_declare_their_icon_so_no_browser_asks_for_favicon_ico():
    with TestClient(app_of()) as http:
        for page in ("/", "/dashboard"):
            icons = re.findall(r'<link rel="icon"[^>]* href="([^"]+)"', http.get(page).text)
            assert icons == ["/dashboard/static/favicon.svg"], page
        icon = http.get(icons[0])
        assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
        assert icon.content.startswith(b"<svg ")


def test_the_snapshot_route_holds_the_engine_state_recent_requests_and_server_facts():
    with TestClient(app_of(enable_request_timeline=True)) as http:
        body = http.get("/dashboard/snapshot", headers=AUTH).json()
        assert body["kv"][0]["blocks"] == "-uuc." and body["kv"][0]["owners"] == {"r-0": [1, 2]}
        assert body["settings"]["model"] == "fake-model" and body["recent"] == []
        assert body["server"] == {"request_timeline": True}
        assert isinstance(body["server_monotonic_s"], float)


def test_nothing_watches_the_engine_until_a_dashboard_route_is_called():
    client = WatchedClient()
    with TestClient(app_of(client)) as http:
        before = len(client.observers)  # the server's own (metrics, the timeline log)
        r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3}, headers=AUTH)
        assert r.status_code == 200
        assert client.snapshots == 0 and len(client.observers) == before
        http.get("/dashboard/snapshot", headers=AUTH)
        assert len(client.observers) == before + 1
        http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3}, headers=AUTH)
        recent = http.get("/dashboard/snapshot", headers=AUTH).json()["recent"]
        # Only the request finished after the first look, once, as its final output.
        assert len(recent) == 1 and recent[0]["finish_reason"] == "length"
        assert recent[0]["request_id"].startswith("cmpl-") and recent[0]["request_id"][-2:] == "-0"


def test_snapshots_are_capped_and_shared_whatever_the_number_of_pages():
    now = [0.0]
    client = WatchedClient()
    sampler = DashboardSampler(client, min_interval=0.25, clock=lambda: now[0])

    async def run():
        together = await asyncio.gather(*(sampler.payload() for _ in range(8)))
        assert client.snapshots == 1 and all(p["counters"]["steps"] == 1 for p in together)
        now[0] = 0.2
        assert (await sampler.payload())["counters"]["steps"] == 1  # within the interval: kept
        now[0] = 0.3
        assert (await sampler.payload())["counters"]["steps"] == 2
        assert client.snapshots == sampler.builds == 2

    asyncio.run(run())


def test_a_page_that_leaves_does_not_cancel_the_build_others_wait_for():
    client = WatchedClient()
    sampler = DashboardSampler(client)

    async def run():
        leaving = asyncio.ensure_future(sampler.payload())
        staying = asyncio.ensure_future(sampler.payload())
        await asyncio.sleep(0)
        leaving.cancel()
        assert (await staying)["counters"]["steps"] == 1

    asyncio.run(run())


def test_recent_requests_keep_finished_ones_with_their_latencies():
    recent = RecentRequests(size=2, clock=lambda: 5.0)
    m = RequestMetrics(arrival_time=1.0, queued_time=1.0, first_scheduled_time=1.1,
                       first_token_time=1.5, last_token_time=2.5, finished_time=2.6,
                       num_generation_tokens=5)  # fmt: skip
    done = CompletionOutput(0, "abcde", [1, 2, 3, 4, 5], finish_reason="stop")
    running = RequestOutput("a-0", None, [7, 8], [CompletionOutput(0, "ab", [1, 2])], False,
                            metrics=m)  # fmt: skip
    recent.observe(running)
    assert recent.records() == []
    for rid in ("a-0", "b-0", "c-0"):
        recent.observe(RequestOutput(rid, None, [7, 8], [done], True, metrics=m))
    records = recent.records()
    assert [r["request_id"] for r in records] == ["b-0", "c-0"]  # the oldest went
    r = records[-1]
    assert r["ttft_s"] == pytest.approx(0.5) and r["tpot_s"] == pytest.approx(0.25)
    assert r["finish_reason"] == "stop" and r["finished_at"] == 5.0
    assert [e["event"] for e in r["events"]][-1] == "finished"


def test_the_event_stream_sends_snapshots_until_the_server_drains():
    app = app_of()
    with TestClient(app) as http:
        for bad in ("0.1", "61", "nan", "x"):
            r = http.get(f"/dashboard/events?interval={bad}", headers=AUTH)
            assert r.status_code == 400 and r.json()["error"]["param"] == "interval", bad
        events = []
        with http.stream("GET", "/dashboard/events?interval=0.3", headers=AUTH) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                    if len(events) == 2:
                        app.state.inferd.admission.draining = True  # as a SIGTERM's drain does
        assert len(events) == 2  # the stream ended by itself once the server drained
        assert events[1]["counters"]["steps"] > events[0]["counters"]["steps"]


def test_clients_without_snapshots_and_dead_engines_are_answered_plainly():
    with TestClient(app_of(ScriptedClient())) as http:
        r = http.get("/dashboard/snapshot", headers=AUTH)
        assert r.status_code == 501 and "snapshot" in r.json()["error"]["message"]
        assert http.get("/dashboard").status_code == 200
    with TestClient(app_of(WatchedClient(dead=True))) as http:
        for path in ("/dashboard/snapshot", "/dashboard/events"):
            r = http.get(path, headers=AUTH)
            assert r.status_code == 503 and "boom" in r.json()["error"]["message"], path


def test_disable_dashboard_serves_no_pages_and_no_data():
    with TestClient(app_of(dashboard=False)) as http:
        for path in ("/dashboard", "/dashboard/static/chat.js"):
            assert http.get(path).status_code == 404
        assert http.get("/dashboard/snapshot", headers=AUTH).status_code == 404
        assert http.get("/", headers=AUTH).status_code == 404

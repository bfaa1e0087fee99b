"""`POST /sleep`, `POST /wake_up`, `GET /is_sleeping` served in-process over a tiny random GGUF
model (route → AsyncEngine → its core loop → LLMEngine → EngineCore): a request while asleep is
a 503 naming /wake_up, or with --wake-on-request wakes the model and runs; tokens after a wake
are those before; the sleep gauge in /metrics. Then the engine client across data-parallel
cores (fake ones: every core sleeps, none while requests run, all or none), and the clients
that cannot sleep (501)."""

from __future__ import annotations

import asyncio

import pytest
from fake_client import ScriptedClient
from starlette.testclient import TestClient
from tiny_gguf import tiny_llama_llm

from inferd.engine.frontend.async_core_client import AsyncCoreClient, CoreReplica
from inferd.engine.frontend.async_engine import AsyncEngine
from inferd.engine.transport import ipc
from inferd.errors import RequestsRunning
from inferd.server.app import ServerSettings, create_app

KEY = "sleep-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY = {"prompt": list(range(5, 45)), "max_tokens": 8, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    with tiny_llama_llm(tmp_path_factory.mktemp("tiny"), kv_cache_memory=16 << 20) as llm:
        yield llm


def _served(llm, **settings):
    return TestClient(create_app(AsyncEngine(llm.engine), ServerSettings(api_key=KEY, **settings)))


def _gauge(http) -> float:
    line = next(ln for ln in http.get("/metrics").text.splitlines()
                if ln.startswith("inferd:engine_sleep_state{"))  # fmt: skip
    return float(line.rsplit(" ", 1)[1])


def test_asleep_requests_get_503_until_woken_and_tokens_are_unchanged(llm):
    with _served(llm) as http:
        before = http.post("/generate", json=BODY, headers=AUTH).json()["token_ids"]
        assert http.get("/is_sleeping", headers=AUTH).json() == {"is_sleeping": False}
        assert http.post("/sleep?level=1").status_code == 401  # behind the key
        bad = http.post("/sleep?level=3", headers=AUTH)
        assert bad.status_code == 400 and "level must be 1 or 2" in bad.json()["error"]["message"]
        unknown = http.post("/sleep?level=1&mode=abort", headers=AUTH)
        assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "mode"
        slept = http.post("/sleep?level=1", headers=AUTH)
        assert slept.status_code == 200, slept.text
        answer = slept.json()
        pool = llm.engine.setup.kv_plan.total_bytes
        assert answer["level"] == 1 and answer["freed_bytes"] == pool
        assert answer["rss_before"] > 0 and answer["rss_after"] > 0
        assert http.get("/is_sleeping", headers=AUTH).json() == {"is_sleeping": True}
        assert _gauge(http) == 1
        refused = http.post("/generate", json=BODY, headers=AUTH)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "model_asleep"
        assert "POST /wake_up" in refused.json()["error"]["message"]
        woke = http.post("/wake_up", headers=AUTH)
        assert woke.status_code == 200 and woke.json()["level"] == 1
        assert http.post("/wake_up", headers=AUTH).json()["level"] == 0  # awake: nothing to do
        assert http.post("/generate", json=BODY, headers=AUTH).json()["token_ids"] == before
        assert _gauge(http) == 0


def test_wake_on_request_wakes_the_model_and_the_request_runs(llm):
    with _served(llm, wake_on_request=True) as http:
        before = http.post("/generate", json=BODY, headers=AUTH).json()["token_ids"]
        assert http.post("/sleep?level=2", headers=AUTH).json()["level"] == 2
        assert llm.engine.runner.model is None and _gauge(http) == 2
        reply = http.post("/generate", json=BODY, headers=AUTH)
        assert reply.status_code == 200 and reply.json()["token_ids"] == before
        assert http.get("/is_sleeping", headers=AUTH).json() == {"is_sleeping": False}


# ---- the engine client across data-parallel cores ----------------------------------------------
class _Core:
    """A core process as the client sees it: a Call answered a moment later (an error for
    "sleep" when `fails`); `log` holds the methods called."""

    def __init__(self, log: list, fails: bool = False):
        self.log, self.fails, self.on_message = log, fails, None

    def send(self, message) -> None:
        self.log.append(message.method)
        asyncio.get_running_loop().call_later(0.01, self._answer, message)

    def _answer(self, m: ipc.Call) -> None:
        if m.method == "sleep" and self.fails:
            self.on_message(ipc.CallResult(m.call_id, None, "InvalidRequest", "cannot sleep"))
            return
        if m.method == "sleep":
            result = {"level": m.args[0], "freed_bytes": 10, "rss_before": 100, "rss_after": 90}
        else:
            result = {"level": 1, "seconds": 0.5, "rss_after": 100}
        self.on_message(ipc.CallResult(m.call_id, result))


def _client(*fails: bool) -> tuple[AsyncCoreClient, list[list]]:
    client = AsyncCoreClient.__new__(AsyncCoreClient)  # no model, no processes
    logs = [[] for _ in fails]
    cores = [_Core(log, f) for log, f in zip(logs, fails, strict=True)]
    client._track([CoreReplica(core) for core in cores])
    for replica, core in zip(client.replicas, cores, strict=True):
        core.on_message = lambda message, r=replica: client._on_message(r, message)
    return client, logs


def test_every_core_sleeps_none_while_requests_run_and_all_or_none():
    async def run():
        client, logs = _client(False, False)
        client._loop = asyncio.get_running_loop()
        client._replica_of["r1"] = client.replicas[1]  # one request in flight
        with pytest.raises(RequestsRunning, match="1 request"):
            await client.sleep(1)
        assert logs == [[], []] and not client.is_sleeping()
        client._replica_of.clear()
        answer = await client.sleep(1)
        assert (answer["level"], answer["freed_bytes"], answer["rss_after"]) == (1, 20, 180)
        assert [r.stats.sleep_level for r in client.replicas] == [1, 1]
        assert (await client.wake_up())["level"] == 1 and not client.is_sleeping()
        failing, flogs = _client(False, True)
        failing._loop = asyncio.get_running_loop()
        with pytest.raises(ValueError, match="cannot sleep"):
            await failing.sleep(2)
        assert flogs == [["sleep", "wake_up"], ["sleep", "wake_up"]]  # woken again: none sleeps
        assert not failing.is_sleeping()
        return logs

    assert asyncio.run(run()) == [["sleep", "wake_up"], ["sleep", "wake_up"]]


def test_clients_that_cannot_sleep_answer_501():
    with TestClient(create_app(ScriptedClient(), ServerSettings())) as http:
        r = http.post("/sleep?level=1")
        assert r.status_code == 501 and "ScriptedClient" in r.json()["error"]["message"]
        assert http.get("/is_sleeping").status_code == 501
    with pytest.raises(ValueError, match="--wake-on-request"):
        create_app(ScriptedClient(), ServerSettings(wake_on_request=True))
    pytest.importorskip("ray.serve")
    from inferd.ray_serve.client import RayEngineClient

    client = RayEngineClient.__new__(RayEngineClient)  # the method needs no handle
    with pytest.raises(NotImplementedError, match="not supported with --ray"):
        asyncio.run(client.sleep(1))

"""The KV tiers as the server shows them, without a model (milliseconds): `POST /kv/clear` with
and without tiers, behind the API key, on clients that cannot clear (501) or whose engine died
(503); the tiers' Prometheus series, present with their `tier` label only on a server that has
tiers; the engine client's clear across data-parallel cores; the Ray board adding tiers up."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from fake_client import ScriptedClient
from starlette.testclient import TestClient

from inferd.engine.frontend.async_core_client import AsyncCoreClient, CoreReplica
from inferd.engine.transport import ipc
from inferd.engine_client import EngineStats
from inferd.errors import EngineDeadError, InvalidRequest
from inferd.kv_tier_stats import TierStats
from inferd.server.app import ServerSettings, create_app
from inferd.server.metrics.prometheus import ServerMetrics

KEY = "tier-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MEMORY = TierStats("memory", hits=3, misses=1, bytes_written=4096, bytes_read=2048,
                   load_seconds=0.25, stored_bytes=8192, capacity_bytes=1 << 20)  # fmt: skip
DISK = TierStats("disk", hits=1, misses=2, bytes_written=4096, bytes_read=1024, write_errors=2,
                 damaged=1, stored_bytes=4096, capacity_bytes=1 << 30)  # fmt: skip


def app_of(client, api_key: str | None = KEY):
    return create_app(client, ServerSettings(api_key=api_key))


# ---- POST /kv/clear -----------------------------------------------------------------------------
def test_clear_empties_the_tiers_and_says_how_many_blocks_went():
    client = ScriptedClient(kv_tiers=(MEMORY, DISK), stored_blocks=7)
    with TestClient(app_of(client)) as http:
        first = http.post("/kv/clear", headers=AUTH)
        again = http.post("/kv/clear", headers=AUTH)
    assert first.status_code == 200 and first.json() == {"object": "kv.clear", "removed_blocks": 7}
    assert again.json()["removed_blocks"] == 0 and client.clears == 2


def test_a_server_without_tiers_answers_400_naming_the_flags():
    with TestClient(app_of(ScriptedClient())) as http:
        r = http.post("/kv/clear", headers=AUTH)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert message.startswith("this server keeps no KV tiers")
    assert "--kv-offload-memory" in message and "--kv-offload-dir/--kv-offload-disk" in message


def test_clear_needs_the_api_key_when_the_server_has_one():
    client = ScriptedClient(kv_tiers=(DISK,), stored_blocks=3)
    with TestClient(app_of(client)) as http:
        missing = http.post("/kv/clear")
        wrong = http.post("/kv/clear", headers={"Authorization": "Bearer nope"})
        assert client.clears == 0  # refused before the route ran
        by_header = http.post("/kv/clear", headers={"x-api-key": KEY})
    assert missing.status_code == wrong.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"
    assert by_header.status_code == 200 and by_header.json()["removed_blocks"] == 3
    with TestClient(app_of(ScriptedClient(kv_tiers=(DISK,)), api_key=None)) as http:
        assert http.post("/kv/clear").status_code == 200  # no key configured: open, as all routes
        assert http.get("/kv/clear").status_code == 405


class _NoClear(ScriptedClient):
    clear_kv_tiers = None  # an EngineClient without the optional method


class _RayLike(ScriptedClient):
    async def clear_kv_tiers(self) -> int:
        raise NotImplementedError("clearing the KV tiers is not supported with --ray: because")


class _Dead(ScriptedClient):
    async def clear_kv_tiers(self) -> int:
        raise EngineDeadError("the engine core process exited (exit code 9)")


def test_clients_that_cannot_clear_answer_501_and_a_dead_engine_503():
    with TestClient(app_of(_NoClear())) as http:
        plain = http.post("/kv/clear", headers=AUTH)
    with TestClient(app_of(_RayLike())) as http:
        ray = http.post("/kv/clear", headers=AUTH)
    with TestClient(app_of(_Dead())) as http:
        dead = http.post("/kv/clear", headers=AUTH)
    assert plain.status_code == 501 and "_NoClear" in plain.json()["error"]["message"]
    assert ray.status_code == 501 and ray.json()["error"]["code"] == "not_implemented"
    assert "not supported with --ray" in ray.json()["error"]["message"]
    assert dead.status_code == 503 and "exit code 9" in dead.json()["error"]["message"]


def test_the_ray_client_refuses_with_its_reason():
    pytest.importorskip("ray.serve")
    from inferd.ray_serve.client import RayEngineClient

    client = RayEngineClient.__new__(RayEngineClient)  # the method needs no handle
    with pytest.raises(NotImplementedError, match="one replica per call"):
        asyncio.run(client.clear_kv_tiers())


# ---- /metrics -----------------------------------------------------------------------------------
def _stats(*tiers: TierStats, saved: int = 0, loaded: int = 0, dropped: int = 0,
           late: int = 0) -> EngineStats:  # fmt: skip
    return EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0, 0, kv_tiers=tiers, kv_blocks_saved=saved,
                       kv_blocks_loaded=loaded, kv_saves_dropped=dropped,
                       kv_lookups_late=late)  # fmt: skip


def _value(text: str, series: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith(series + " "))
    return float(line.rsplit(" ", 1)[1])


def test_tier_series_carry_a_tier_label_and_advance_with_the_engine_counts():
    m = ServerMetrics("m")
    m.update_stats(_stats(MEMORY, DISK, saved=5, loaded=3))
    later = dataclasses.replace(MEMORY, hits=10, stored_bytes=0)
    text = m.render(_stats(later, DISK, saved=9, loaded=4, dropped=1, late=2)).decode()
    labels = 'engine="0",model_name="m",tier="{}"'
    assert _value(text, f"inferd:kv_tier_hits_total{{{labels.format('memory')}}}") == 10
    assert _value(text, f"inferd:kv_tier_hits_total{{{labels.format('disk')}}}") == 1
    assert _value(text, f"inferd:kv_tier_misses_total{{{labels.format('disk')}}}") == 2
    assert _value(text, f"inferd:kv_tier_bytes_written_total{{{labels.format('disk')}}}") == 4096
    assert _value(text, f"inferd:kv_tier_bytes_read_total{{{labels.format('memory')}}}") == 2048
    assert _value(text, f"inferd:kv_tier_load_seconds_total{{{labels.format('memory')}}}") == 0.25
    assert _value(text, f"inferd:kv_tier_write_errors_total{{{labels.format('disk')}}}") == 2
    assert _value(text, f"inferd:kv_tier_damaged_total{{{labels.format('disk')}}}") == 1
    assert _value(text, f"inferd:kv_tier_stored_bytes{{{labels.format('memory')}}}") == 0
    assert _value(text, f"inferd:kv_tier_capacity_bytes{{{labels.format('disk')}}}") == 1 << 30
    engine = 'engine="0",model_name="m"'
    assert _value(text, f"inferd:kv_blocks_saved_total{{{engine}}}") == 9
    assert _value(text, f"inferd:kv_blocks_loaded_total{{{engine}}}") == 4
    assert _value(text, f"inferd:kv_saves_dropped_total{{{engine}}}") == 1
    assert _value(text, f"inferd:kv_lookups_late_total{{{engine}}}") == 2
    # The file's conventions: HELP and TYPE as for the prefix cache's counters.
    assert "# TYPE inferd:kv_tier_hits_total counter" in text
    assert "# TYPE inferd:kv_tier_stored_bytes gauge" in text
    assert "# HELP inferd:kv_tier_hits_total KV blocks found in the tier and loaded." in text


def test_each_data_parallel_engine_has_its_own_tier_series():
    replicas = [_stats(MEMORY, saved=1), _stats(dataclasses.replace(MEMORY, hits=7), saved=2)]
    m = ServerMetrics("m", replica_stats=lambda: replicas)
    text = m.render(_stats()).decode()
    assert _value(text, 'inferd:kv_tier_hits_total{engine="1",model_name="m",tier="memory"}') == 7
    assert _value(text, 'inferd:kv_blocks_saved_total{engine="0",model_name="m"}') == 1


def test_the_served_metrics_hold_tier_series_only_with_tiers():
    with TestClient(app_of(ScriptedClient(kv_tiers=(MEMORY, DISK)))) as http:
        tiered = http.get("/metrics").text
    with TestClient(app_of(ScriptedClient())) as http:
        plain = http.get("/metrics").text
    assert 'inferd:kv_tier_hits_total{engine="0",model_name="fake-model",tier="disk"} 1.0' in tiered
    assert 'tier="memory"' in tiered and "inferd:kv_blocks_saved_total" in tiered
    assert "kv_tier" not in plain and "inferd:kv_blocks" not in plain  # not even HELP lines
    assert "inferd:kv_saves_dropped" not in plain and "inferd:kv_lookups_late" not in plain
    assert "inferd:prefix_cache_hits_total" in plain


# ---- the engine client across data-parallel cores ----------------------------------------------
class _Core:
    """A core process as the client sees it: a Call is answered a moment later with its count
    of blocks; the log holds when each call came and when it was answered."""

    def __init__(self, log: list, name: str, removed: int):
        self.log, self.name, self.removed = log, name, removed
        self.on_message = None

    def send(self, message) -> None:
        assert isinstance(message, ipc.Call) and message.method == "clear_kv_tiers"
        self.log.append(f"{self.name} called")
        asyncio.get_running_loop().call_later(0.01, self._answer, message.call_id)

    def _answer(self, call_id: int) -> None:
        self.log.append(f"{self.name} answered")
        self.on_message(ipc.CallResult(call_id, self.removed))


def _client(config, removed: list[int], dead: tuple[int, ...] = ()) -> tuple[AsyncCoreClient, list]:
    client = AsyncCoreClient.__new__(AsyncCoreClient)  # no model, no processes
    client.config, calls = config, []
    cores = [_Core(calls, f"core {i}", n) for i, n in enumerate(removed)]
    client._track([CoreReplica(core) for core in cores])
    for i, (replica, core) in enumerate(zip(client.replicas, cores, strict=True)):
        core.on_message = lambda message, r=replica: client._on_message(r, message)
        replica.dead = "it exited" if i in dead else None
    return client, calls


def test_the_client_clears_every_live_core_one_after_the_other():
    from inferd.config import EngineConfig

    tiered = EngineConfig(kv_offload_memory=1 << 20)

    async def clear(client):
        client._loop = asyncio.get_running_loop()
        return await client.clear_kv_tiers()

    client, calls = _client(tiered, [5, 0, 2], dead=(1,))
    assert asyncio.run(clear(client)) == 7
    # The replicas share their tiers' folders: concurrent clears would count a block twice.
    assert calls == ["core 0 called", "core 0 answered", "core 2 called", "core 2 answered"]
    client, calls = _client(EngineConfig(), [5])
    with pytest.raises(InvalidRequest, match="keeps no KV tiers"):
        asyncio.run(clear(client))
    client, calls = _client(tiered, [5, 5], dead=(0, 1))
    with pytest.raises(EngineDeadError):
        asyncio.run(clear(client))
    assert calls == []


def test_the_ray_board_adds_the_replicas_tiers_by_name():
    from inferd.ray_serve.replica_board import ReplicaBoard
    from inferd.ray_serve.wire import ReplicaReport

    board = ReplicaBoard("m")
    board.report(ReplicaReport("a", "n1", None, _stats(MEMORY, DISK, saved=2)))
    board.report(ReplicaReport("b", "n2", None, _stats(DISK, saved=3)))
    total = board.stats()
    assert [t.name for t in total.kv_tiers] == ["memory", "disk"] and total.kv_blocks_saved == 5
    assert total.kv_tiers[1].hits == 2 and total.kv_tiers[1].write_errors == 4
    assert total.kv_tiers[1].stored_bytes == DISK.stored_bytes  # one folder, not added up

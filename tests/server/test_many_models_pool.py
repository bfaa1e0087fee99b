"""The pool of many models (server/multimodel/pool.py) with fake loaders, estimators and apps
(milliseconds): least-recently-used eviction under --max-loaded-memory and --max-loaded-models
together, a model too big for the budget failing alone with both figures, a request that needs
a busy model's room waiting rather than unloading it, the measured figure replacing the
estimate, keep-alive expiry (0, negative, a duration, --idle-unload), and the dispatcher's
Ollama keep_alive (durations, `ollama stop`, preload, a bad value in Ollama's error shape)."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from inferd.commands.serve_args import add_arguments
from inferd.commands.serve_models import build_server
from inferd.server.multimodel.memory import ModelMemory
from inferd.server.multimodel.pool import (
    AVAILABLE,
    LOADED,
    ModelPool,
    ModelSlot,
    ModelTooLarge,
)
from inferd.server.ollama.keep_alive import check_keep_alive, seconds
from inferd.server.ollama.models import FOREVER

MiB = 1 << 20


def fake_app(name: str, seen: list | None = None) -> Starlette:
    """A model's app: answers every route with its name and the body it got."""

    async def echo(request):
        body = await request.body()
        if seen is not None:
            seen.append(json.loads(body) if body else None)
        return JSONResponse({"served_by": name})

    paths = ("/api/generate", "/api/chat", "/v1/completions")
    app = Starlette(routes=[Route(p, echo, methods=["POST"]) for p in paths])
    app.state.inferd = SimpleNamespace(client=SimpleNamespace(),
                                       info=SimpleNamespace(max_model_len=64))  # fmt: skip
    return app


class Fakes:
    """Loader, estimator and measure with a record of what happened."""

    def __init__(self, sizes: dict[str, int], measured: dict[str, int] | None = None):
        self.sizes, self.measured = sizes, measured or {}
        self.loads: list[str] = []
        self.estimates: list[str] = []

    def loader(self, name: str, path: str):
        self.loads.append(name)
        return fake_app(name)

    def estimator(self, name: str, path: str) -> ModelMemory:
        self.estimates.append(name)
        return ModelMemory(self.sizes[name], 0, 0)

    async def measure(self, app) -> ModelMemory | None:
        name = next(n for n in self.sizes if self.loads and self.loads[-1] == n)
        if name not in self.measured:
            return None
        return ModelMemory(self.measured[name], 0, 0, measured=True)


def pool_of(fakes: Fakes, max_loaded: int = 10, max_memory: int | None = None,
            idle_unload_s: float | None = None) -> ModelPool:  # fmt: skip
    slots = {n: ModelSlot(n, f"/models/{n}.gguf") for n in fakes.sizes}
    return ModelPool(slots, fakes.loader, max_loaded, idle_unload_s, None, max_memory,
                     fakes.estimator, fakes.measure)  # fmt: skip


def states(pool: ModelPool) -> dict[str, str]:
    return {n: s.state for n, s in pool.slots.items()}


async def use(pool: ModelPool, name: str, keep_alive_s: float | None = None) -> None:
    pool.release(await pool.acquire(name, keep_alive_s))


async def settle() -> None:
    for _ in range(20):  # unloads started by release run as tasks
        await asyncio.sleep(0)


def test_the_budget_unloads_the_least_recently_used_idle_models_until_the_new_one_fits():
    fakes = Fakes({"a": 40 * MiB, "b": 40 * MiB, "c": 40 * MiB, "d": 70 * MiB})

    async def run():
        pool = pool_of(fakes, max_loaded=3, max_memory=100 * MiB)
        await use(pool, "a")
        await use(pool, "b")
        await use(pool, "a")  # a is now the more recently used
        assert pool.memory_used() == 80 * MiB
        await use(pool, "c")  # 120 > 100: b goes, not a
        assert states(pool) == {"a": LOADED, "b": AVAILABLE, "c": LOADED, "d": AVAILABLE}
        await use(pool, "d")  # 150 > 100 and 110 > 100: a then c
        assert states(pool) == {"a": AVAILABLE, "b": AVAILABLE, "c": AVAILABLE, "d": LOADED}
        await pool.close()

    asyncio.run(run())
    assert fakes.loads == ["a", "b", "c", "d"]
    assert sorted(fakes.estimates) == ["a", "b", "c", "d"]  # once per model


def test_both_limits_hold_a_seat_short_even_when_memory_fits():
    fakes = Fakes({"a": MiB, "b": MiB, "c": MiB})

    async def run():
        pool = pool_of(fakes, max_loaded=2, max_memory=100 * MiB)
        for name in ("a", "b", "c"):
            await use(pool, name)
        assert states(pool) == {"a": AVAILABLE, "b": LOADED, "c": LOADED}

    asyncio.run(run())


def test_a_model_too_big_for_the_budget_fails_alone_naming_both_figures():
    fakes = Fakes({"small": 10 * MiB, "huge": 300 * MiB})

    async def run():
        pool = pool_of(fakes, max_memory=256 * MiB)
        await use(pool, "small")
        with pytest.raises(ModelTooLarge) as e:
            await pool.acquire("huge")
        assert "'huge'" in str(e.value) and "300 MiB" in str(e.value)
        assert "256 MiB" in str(e.value) and "--max-loaded-memory" in str(e.value)
        # nothing was unloaded for it, and the other model still serves
        assert states(pool) == {"small": LOADED, "huge": AVAILABLE}
        await use(pool, "small")

    asyncio.run(run())
    assert fakes.loads == ["small"]


def test_a_request_that_needs_a_busy_models_room_waits_until_it_is_idle():
    fakes = Fakes({"a": 60 * MiB, "b": 60 * MiB})

    async def run():
        pool = pool_of(fakes, max_memory=100 * MiB)
        busy = await pool.acquire("a")  # a request in flight on a
        waiting = asyncio.ensure_future(pool.acquire("b"))
        await settle()
        assert not waiting.done() and states(pool) == {"a": LOADED, "b": AVAILABLE}
        pool.release(busy)  # a is idle now: it makes room
        slot = await asyncio.wait_for(waiting, 5)
        assert slot.name == "b" and states(pool) == {"a": AVAILABLE, "b": LOADED}

    asyncio.run(run())


def test_once_loaded_the_measured_figure_counts_and_evicts_if_the_estimate_was_low():
    fakes = Fakes({"a": 30 * MiB, "b": 30 * MiB}, measured={"a": 40 * MiB, "b": 80 * MiB})

    async def run():
        pool = pool_of(fakes, max_memory=100 * MiB)
        await use(pool, "a")
        assert pool.slots["a"].memory.measured and pool.memory_used() == 40 * MiB
        await use(pool, "b")  # estimated 30 + 40 fits; measured 80 + 40 does not: a goes
        await settle()
        assert states(pool) == {"a": AVAILABLE, "b": LOADED}
        assert pool.memory_used() == 80 * MiB

    asyncio.run(run())


def test_keep_alive_zero_unloads_after_the_request_and_negative_never_expires():
    fakes = Fakes({"a": MiB, "b": MiB})

    async def run():
        pool = pool_of(fakes, idle_unload_s=0.01)
        slot = await pool.acquire("a", 0.0)
        assert pool.slots["a"].state == LOADED  # not while its request runs
        pool.release(slot)
        await settle()
        assert pool.slots["a"].state == AVAILABLE
        await use(pool, "b", -1.0)  # forever, despite --idle-unload
        assert pool.expires_at(pool.slots["b"]) is None
        await use(pool, "b", 90.0)  # a duration counts from the request's end
        at = pool.expires_at(pool.slots["b"])
        assert at == pytest.approx(pool.slots["b"].last_used + 90.0)
        await use(pool, "b")  # no keep_alive: the server's --idle-unload again
        assert pool.expires_at(pool.slots["b"]) == pytest.approx(
            pool.slots["b"].last_used + 0.01)  # fmt: skip

    asyncio.run(run())


def test_idle_unload_and_keep_alive_durations_expire_by_themselves():
    fakes = Fakes({"a": MiB, "b": MiB, "c": MiB})

    async def run():
        pool = pool_of(fakes, idle_unload_s=0.05)
        sweeper = asyncio.ensure_future(pool.run_expiry())
        await use(pool, "a")  # --idle-unload
        await use(pool, "b", 0.02)  # its own keep_alive
        await use(pool, "c", -1)  # never
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (
            pool.slots["a"].state != AVAILABLE or pool.slots["b"].state != AVAILABLE):  # fmt: skip
            await asyncio.sleep(0.01)
        assert states(pool) == {"a": AVAILABLE, "b": AVAILABLE, "c": LOADED}
        sweeper.cancel()

    asyncio.run(run())


def test_a_failed_estimate_fails_only_that_models_requests():
    fakes = Fakes({"a": MiB, "bad": MiB})
    real = fakes.estimator

    def estimator(name, path):
        if name == "bad":
            raise ValueError("not a GGUF file")
        return real(name, path)

    fakes.estimator = estimator

    async def run():
        pool = pool_of(fakes, max_memory=100 * MiB)
        with pytest.raises(Exception, match="'bad' failed to load: ValueError: not a GGUF"):
            await pool.acquire("bad")
        await use(pool, "a")
        assert states(pool) == {"a": LOADED, "bad": AVAILABLE}

    asyncio.run(run())


# ---- through the dispatcher: the routes ----------------------------------------------------
def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(flags))


def served(fakes: Fakes, seen: list, *flags: str):
    def loader(name, path):
        fakes.loads.append(name)
        return fake_app(name, seen)

    args = parse(*[f for n in fakes.sizes for f in ("--model", f"{n}=/models/{n}.gguf")], *flags)
    app, _ = build_server(args, loader=loader, estimator=fakes.estimator)
    return TestClient(app)


def expires_in(entry: dict) -> float:
    at = datetime.fromisoformat(entry["expires_at"].replace("Z", "+00:00"))
    return (at - datetime.now(UTC)).total_seconds()


def test_ollama_keep_alive_through_the_dispatcher():
    fakes, seen = Fakes({"a": 10 * MiB, "b": 10 * MiB}), []
    with served(fakes, seen, "--max-loaded-models", "2", "--idle-unload", "600",
                "--max-loaded-memory", "64MiB") as http:  # fmt: skip
        # preload: no prompt, a duration; the model's app gets the body without keep_alive
        r = http.post("/api/generate", json={"model": "a", "keep_alive": "1h30m"})
        assert r.json() == {"served_by": "a"} and seen[-1] == {"model": "a"}
        (entry,) = http.get("/api/ps").json()["models"]
        assert entry["name"] == "a:latest" and entry["size"] == 10 * MiB
        assert 5300 < expires_in(entry) <= 5400
        # negative: forever, whatever --idle-unload says
        http.post("/api/chat", json={"model": "b", "keep_alive": -1, "messages": [
            {"role": "user", "content": "hi"}]})  # fmt: skip
        ps = http.get("/api/ps").json()
        assert {m["name"]: m["expires_at"] for m in ps["models"]}["b:latest"] == FOREVER
        assert ps["budget"]["memory_used_bytes"] == 20 * MiB
        assert ps["budget"]["max_memory_bytes"] == 64 * MiB
        # an OpenAI request sets the server's keep-alive again (as Ollama's own routes do)
        http.post("/v1/completions", json={"model": "b", "prompt": "x"})
        (b,) = [m for m in http.get("/api/ps").json()["models"] if m["name"] == "b:latest"]
        assert 500 < expires_in(b) <= 600
        # `ollama stop b`: keep_alive 0 and nothing to run unloads it at once, answered "unload"
        r = http.post("/api/generate", json={"model": "b", "keep_alive": 0})
        assert r.json()["done_reason"] == "unload" and r.json()["done"] is True
        assert [m["name"] for m in http.get("/api/ps").json()["models"]] == ["a:latest"]
        loads = list(fakes.loads)
        r = http.post("/api/chat", json={"model": "b", "keep_alive": "0s", "messages": []})
        assert r.json()["done_reason"] == "unload" and fakes.loads == loads  # nothing loaded
        # a bad value: a 400 in Ollama's shape, naming the field
        r = http.post("/api/generate", json={"model": "a", "keep_alive": "soon"})
        assert r.status_code == 400 and "keep_alive" in r.json()["error"]
        cards = {c["id"]: c for c in http.get("/v1/models").json()["data"]}
        assert cards["a"]["memory"]["total_bytes"] == 10 * MiB
        assert cards["a"]["memory"]["source"] == "estimated"
        assert cards["b"]["state"] == "available"


def test_a_model_too_big_answers_its_own_requests_with_both_figures():
    fakes, seen = Fakes({"a": 10 * MiB, "huge": 100 * MiB}), []
    with served(fakes, seen, "--max-loaded-memory", "64MiB") as http:
        assert http.post("/v1/completions", json={"model": "a"}).status_code == 200
        r = http.post("/v1/completions", json={"model": "huge"})
        assert r.status_code == 500 and r.json()["error"]["code"] == "model_too_large"
        assert "100 MiB" in r.json()["error"]["message"]
        assert "64 MiB" in r.json()["error"]["message"]
        r = http.post("/api/generate", json={"model": "huge", "prompt": "x"})
        assert "100 MiB" in r.json()["error"]  # Ollama's shape
        assert http.post("/v1/completions", json={"model": "a"}).json() == {"served_by": "a"}
    assert fakes.loads == ["a"]


def test_single_model_keep_alive_refuses_only_unloading_values():
    for value in ("5m", "1h30m", -1, "-1", 300, None):
        check_keep_alive(value)
    with pytest.raises(Exception, match=r"--model NAME=PATH"):
        check_keep_alive(0)
    assert seconds("1h30m") == 5400 and seconds("-1m") == -60 and seconds(" 2.5 ") == 2.5


def test_the_ollama_client_reads_ps_and_stop():
    ollama = pytest.importorskip("ollama")
    import httpx

    fakes = Fakes({"a": 10 * MiB, "b": 10 * MiB})
    args = parse("--model", "a=/m/a.gguf", "--model", "b=/m/b.gguf", "--max-loaded-memory",
                 "1GiB", "--max-loaded-models", "2")  # fmt: skip
    app, _ = build_server(args, loader=lambda n, p: fake_app(n), estimator=fakes.estimator)

    async def run():
        client = ollama.AsyncClient(host="http://testserver",
                                    transport=httpx.ASGITransport(app))  # fmt: skip
        await client.generate(model="a", keep_alive="10m")  # preload
        (model,) = (await client.ps()).models
        assert model.name == "a:latest" and model.size == 10 * MiB
        left = (model.expires_at - datetime.now(UTC)).total_seconds()
        assert 540 < left <= 600
        stopped = await client.generate(model="a", keep_alive=0)  # what `ollama stop a` sends
        assert stopped.done_reason == "unload" and (await client.ps()).models == []

    asyncio.run(run())

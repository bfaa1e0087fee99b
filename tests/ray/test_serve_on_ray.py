"""inferd on Ray Serve, end to end, on a two-node Ray cluster on loopback (the embedded model):
the application `serve run inferd.commands.serve_ray:build_app` builds, two engine replicas on
two nodes behind one ingress, against `inferd serve` with the same flags.

* the official openai client gets what `inferd serve` gives: completions, chat, streaming,
  tools, response_format, seeded sampling, and the same 400s;
* a repeated prompt is routed to the replica holding its KV blocks (a cache hit, counted);
* a replica killed mid-run fails only its own requests (error event, then [DONE]); the rest
  finish, /health stays up, and Serve has a replacement serving;
* an autoscaling deployment goes from one replica to two under load and back when idle.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from ray_helpers import ReferenceServer, samples, wait_for

pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow

# Flags of both servers (the builder's arguments are `inferd serve` flags by name). The default
# mode (GGUF blocks, C kernels): it loads and decodes several times faster than float32 here, and
# gives a prompt the same tokens whatever else its replica runs.
ENGINE = {"kv_cache_memory": "96MiB", "max_num_batched_tokens": 512,
          "max_model_len": 1024, "max_num_seqs": 8, "enable_auto_tool_choice": True,
          "tool_call_parser": "pythonic", "disable_log_requests": True}  # fmt: skip
RAY = {"num_replicas": 2, "replica_cpus": 1, "max_replicas_per_node": 1, "threads": 1}
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]  # fmt: skip
CITY = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city", "country"], "additionalProperties": False}  # fmt: skip


def _deploy(values: dict, name: str = "inferd") -> None:
    from ray import serve

    from inferd.commands.serve_ray import build_app

    serve.run(build_app(values), name=name, route_prefix="/")


@pytest.fixture(scope="module")
def reference():
    from inferd.commands import serve
    from inferd.commands.serve_ray import _RaisingParser, builder_argv

    parser = _RaisingParser(add_help=False)
    serve.add_arguments(parser)
    server = ReferenceServer([*builder_argv(ENGINE, parser), "--threads", "1"])
    yield server
    server.stop()


@pytest.fixture(scope="module")
def ray_app(ray_cluster, reference):
    started = time.monotonic()
    _deploy({**ENGINE, **RAY})
    print(f"\n[ray] 2 replicas serving {time.monotonic() - started:.1f} s after serve.run")
    reference.wait_ready()
    yield ray_cluster.url
    from ray import serve

    serve.delete("inferd")


def _clients(ray_app: str, reference: ReferenceServer) -> list:
    return [openai.OpenAI(base_url=u + "/v1", api_key="unused", max_retries=0, timeout=120)
            for u in (ray_app, reference.url)]  # fmt: skip


def _replicas(url: str) -> dict[str, str]:
    """Healthy replicas → their node, from the ingress's /metrics."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return {labels["replica"]: labels["node"]
            for labels, up in samples(text, "inferd:replica_up") if up == 1.0}  # fmt: skip


def test_two_replicas_on_two_nodes(ray_app):
    replicas = wait_for(lambda: len(_replicas(ray_app)) == 2 and _replicas(ray_app), 30)
    assert replicas and len(set(replicas.values())) == 2
    assert httpx.get(ray_app + "/health").status_code == 200


def test_the_openai_client_gets_what_inferd_serve_gives(ray_app, reference):
    def ask(client) -> list:
        out = []
        c = client.completions.create(model="gemma-3-270m", prompt="The capital of France is",
                                      max_tokens=12, temperature=0)  # fmt: skip
        out.append(c.choices[0].text)
        c = client.completions.create(model="gemma-3-270m", prompt="Once upon a time",
                                      max_tokens=12, temperature=0.9, seed=42)  # fmt: skip
        out.append(c.choices[0].text)
        msgs = [{"role": "user", "content": "Name three colors."}]
        c = client.chat.completions.create(model="gemma-3-270m", messages=msgs, max_tokens=12,
                                           temperature=0)  # fmt: skip
        out.append(c.choices[0].message.content)
        stream = client.chat.completions.create(
            model="gemma-3-270m", messages=msgs, max_tokens=12, temperature=0, stream=True
        )
        out.append("".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices))
        weather = [{"role": "user", "content": "What is the weather in Paris?"}]
        c = client.chat.completions.create(
            model="gemma-3-270m",
            messages=weather,
            tools=WEATHER,
            tool_choice="required",
            temperature=0,
            max_tokens=40,
        )
        call = c.choices[0].message.tool_calls[0].function
        out.append((call.name, json.loads(call.arguments)))
        where = [{"role": "user", "content": "Where is the Eiffel Tower?"}]
        c = client.chat.completions.create(
            model="gemma-3-270m", messages=where, temperature=0, max_tokens=40,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "place", "schema": CITY}})  # fmt: skip
        out.append(json.loads(c.choices[0].message.content))
        return out

    on_ray, served = (ask(c) for c in _clients(ray_app, reference))
    assert on_ray == served
    assert on_ray[3] == on_ray[2]  # the stream holds the same reply
    assert on_ray[4][0] == "get_weather" and set(on_ray[5]) == {"city", "country"}


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "Hi", "max_tokens": 4, "temperature": -1},
        {"prompt": "Hi", "max_tokens": 4, "logprobs": 99},
        {"prompt": "Hi " * 1200, "max_tokens": 4},
        {"prompt": "Hi", "max_tokens": 4, "n": 500},
        {
            "prompt": "Hi",
            "max_tokens": 4,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "no-such-type"}},
            },
        },  # fmt: skip
    ],
)
def test_refusals_are_inferd_serves(ray_app, reference, body):
    answers = [httpx.post(u + "/v1/completions", json={"model": "gemma-3-270m", **body},
                          timeout=60) for u in (ray_app, reference.url)]  # fmt: skip
    assert answers[0].status_code == answers[1].status_code == 400
    assert answers[0].json() == answers[1].json()


def test_a_repeated_prompt_goes_where_its_blocks_are(ray_app):
    prompt = list(range(1000, 1080))  # 80 token ids: five full KV blocks

    def decisions() -> float:
        text = httpx.get(ray_app + "/metrics").text
        return sum(v for labels, v in samples(text, "inferd:router_decisions_total")
                   if labels["decision"] == "prefix_hit")  # fmt: skip

    hits_before = decisions()
    cached = []
    for _ in range(3):
        r = httpx.post(ray_app + "/v1/completions", timeout=60,
                       json={"prompt": prompt, "max_tokens": 2, "temperature": 0})  # fmt: skip
        cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert cached[0] == 0 and cached[1] == cached[2] == 64  # the last block is computed again
    assert decisions() - hits_before == 2


async def _stream(url: str, i: int, max_tokens: int) -> dict:
    body = {
        "prompt": f"Request {i}: a long story about the number {i * 7919}.",
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    text, error, done = "", None, False
    async with httpx.AsyncClient(timeout=300) as client:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        error = event["error"]["message"]
                    else:
                        text += event["choices"][0]["text"]
    return {"text": text, "error": error, "done": done}


def test_a_killed_replica_fails_only_its_requests_and_is_replaced(ray_app):
    import ray

    async def run() -> tuple[list[dict], str, float, list[int]]:
        # long enough to be running on both replicas when one is killed, at any decode speed
        tasks = [asyncio.create_task(_stream(ray_app, i, 256)) for i in range(6)]

        def busy() -> dict[str, float]:
            text = httpx.get(ray_app + "/metrics").text
            running = {labels["replica"]: v for labels, v
                       in samples(text, "inferd:replica_num_requests_running")}  # fmt: skip
            return running if len(running) == 2 and all(running.values()) else {}

        running = await asyncio.to_thread(wait_for, busy, 60)
        assert running, "both replicas should be running requests"
        victim = max(running, key=running.get)
        ray.kill(ray.get_actor(f"SERVE_REPLICA::inferd#InferdEngine#{victim}", namespace="serve"))
        killed_at = time.monotonic()
        during = []  # a request and /health while the replica is gone: the survivor serves
        during.append(httpx.get(ray_app + "/health").status_code)
        r = await asyncio.to_thread(httpx.post, ray_app + "/v1/completions", timeout=120,
                                    json={"prompt": "Meanwhile", "max_tokens": 4})  # fmt: skip
        during.append(r.status_code)
        return await asyncio.gather(*tasks), victim, killed_at, during

    results, victim, killed_at, during = asyncio.run(run())
    failed = [r for r in results if r["error"]]
    assert failed, "the killed replica was running requests"
    for r in results:
        assert r["done"]  # every stream ends with [DONE], failed or not
        if r["error"]:
            assert f"engine replica {victim}" in r["error"] and "died" in r["error"]
        else:
            assert len(r["text"]) > 0
    assert during == [200, 200]

    def replaced() -> bool:
        replicas = _replicas(ray_app)
        return len(replicas) == 2 and victim not in replicas

    assert wait_for(replaced, 180, 0.5), _replicas(ray_app)
    seconds = time.monotonic() - killed_at
    print(
        f"\n[ray] killed replica {victim}: {len(failed)} of {len(results)} streams failed, "
        f"all its own; a replacement served {seconds:.1f} s after the kill"
    )
    ok = httpx.post(ray_app + "/v1/completions", json={"prompt": "After", "max_tokens": 4},
                    timeout=120)  # fmt: skip
    assert ok.status_code == 200


@pytest.mark.filterwarnings("ignore:The `metrics_interval_s`:DeprecationWarning")
def test_autoscaling_from_one_replica_to_two_and_back(ray_app, ray_cluster):
    from ray import serve

    serve.delete("inferd")  # its two replicas hold the CPUs the scaled one needs
    scale = {"min_replicas": 1, "max_replicas": 2, "replica_cpus": 1, "max_replicas_per_node": 1,
             "threads": 1, "autoscaling_config": {"target_ongoing_requests": 1,
             "upscale_delay_s": 0, "downscale_delay_s": 3, "look_back_period_s": 2,
             "metrics_interval_s": 0.5}}  # fmt: skip
    _deploy({**ENGINE, **scale}, name="inferd-auto")

    def running() -> int:
        status = serve.status().applications["inferd-auto"].deployments["InferdEngine"]
        return status.replica_states.get("RUNNING", 0)

    try:
        assert running() == 1

        # Four clients stream one request after another until the second replica runs: the
        # load lasts as long as the scale-up takes, however fast this machine decodes.
        stop, results = threading.Event(), []

        async def client(first: int) -> None:
            i = first
            while not stop.is_set():
                results.append(await _stream(ray_cluster.url, i, 64))
                i += 4

        async def load() -> None:
            await asyncio.gather(*(client(i) for i in range(4)))

        started = time.monotonic()
        loader = threading.Thread(target=lambda: asyncio.run(load()))
        loader.start()
        try:
            scaled = wait_for(lambda: running() == 2, 120, 0.5)
        finally:
            stop.set()
            loader.join(300)
        assert scaled, "no second replica under load"
        up = time.monotonic() - started
        assert not loader.is_alive()
        assert len(results) >= 4 and all(r["done"] and not r["error"] for r in results)
        idle = time.monotonic()
        assert wait_for(lambda: running() == 1, 120, 0.5), "still two replicas when idle"
        print(
            f"\n[ray] autoscaling: 2 replicas running {up:.1f} s into the load, back to 1 "
            f"{time.monotonic() - idle:.1f} s after it ended"
        )
    finally:
        serve.delete("inferd-auto")

"""Many models in one server (issue 56, item 1): two tiny random GGUF models (Llama and Qwen2
shapes: different outputs) behind the dispatcher with --max-loaded-models 1, each built by the
real loader (serve_app.py, the in-process engine to keep the test fast): alternating requests
give each model's own greedy tokens (equal to the model run alone), loads and unloads are counted
in /metrics, a file that does not load fails only its own requests, an unknown name is a 404,
and two names for one file are refused at start; --idle-unload unloads by itself (the engine
stopped, not dead), the KV pool estimated before a load is the one the engine allocates, and
--data-parallel-size 2 gives each model its own two core processes."""

from __future__ import annotations

import argparse

import pytest
from starlette.testclient import TestClient
from tiny_gguf import write_tiny_gguf

from inferd.commands.serve_args import add_arguments
from inferd.commands.serve_model_flags import model_specs, serves_many
from inferd.commands.serve_models import build_server

PROMPT = [1, 5, 9, 14, 20]
ENGINE = ["--no-engine-core-process", "--kv-cache-memory", "16MiB", "--max-model-len", "256"]


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(flags))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("many")
    for arch in ("llama", "qwen2"):
        write_tiny_gguf(folder / f"{arch}.gguf", arch)
    (folder / "broken.gguf").write_bytes(b"not a GGUF file")
    return folder


@pytest.fixture(scope="module")
def alone(files):
    """Each model's greedy tokens, run alone (what a single-model server returns)."""
    from inferd import LLM, SamplingParams

    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    out = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("INFERD_WEIGHT_CACHE", "0")
        for arch in ("llama", "qwen2"):
            llm = LLM(model=str(files / f"{arch}.gguf"), kv_cache_memory=16 << 20,
                      max_model_len=256)  # fmt: skip
            (result,) = llm.generate([{"prompt_token_ids": PROMPT}], params)
            out[arch] = list(result.outputs[0].token_ids)
            del llm
    assert out["llama"] != out["qwen2"]  # else the test could not tell the models apart
    return out


def complete(http: TestClient, model: str):
    return http.post("/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": 6,
                                              "temperature": 0, "ignore_eos": True,
                                              "return_token_ids": True})  # fmt: skip


def sample(metrics: str, name: str, model: str) -> float:
    line = next(x for x in metrics.splitlines() if x.startswith(f'{name}{{model="{model}"}}'))
    return float(line.split()[-1])


def test_alternating_models_under_one_seat_give_each_its_own_tokens(files, alone, monkeypatch):
    monkeypatch.setenv("INFERD_WEIGHT_CACHE", "0")
    args = parse("--models-dir", str(files), "--max-loaded-models", "1", *ENGINE)
    app, _ = build_server(args)
    with TestClient(app) as http:
        cards = {c["id"]: c for c in http.get("/v1/models").json()["data"]}
        assert {n: c["state"] for n, c in cards.items()} == {
            "broken": "available", "llama": "available", "qwen2": "available"}  # fmt: skip
        for model in ("llama", "qwen2", "llama", "qwen2"):
            r = complete(http, model)
            assert r.status_code == 200, r.text
            assert r.json()["model"] == model
            assert r.json()["choices"][0]["token_ids"] == alone[model]
        cards = {c["id"]: c for c in http.get("/v1/models").json()["data"]}
        assert cards["qwen2"]["state"] == "loaded" and cards["qwen2"]["memory_bytes"] > 0
        assert cards["llama"]["state"] == "available"
        # A file that does not load fails its own requests, with the loader's message ...
        bad = complete(http, "broken")
        assert bad.status_code == 500 and bad.json()["error"]["code"] == "model_load_failed"
        assert "broken" in bad.json()["error"]["message"]
        assert "last_error" in http.get("/v1/models/broken").json()
        # ... and nothing else: the others still load and answer.
        assert complete(http, "llama").json()["choices"][0]["token_ids"] == alone["llama"]
        missing = complete(http, "nope")
        assert missing.status_code == 404
        assert "'llama'" in missing.json()["error"]["message"]
        # Ollama's routes name it too, with its :latest tag, and get errors in Ollama's shape.
        ps = http.get("/api/ps").json()["models"]
        assert [m["name"] for m in ps] == ["llama:latest"] and ps[0]["size"] > 0
        assert http.post("/api/show", json={"model": "nope"}).json() == {
            "error": missing.json()["error"]["message"]}  # fmt: skip
        metrics = http.get("/metrics").text
    assert sample(metrics, "inferd:model_loads_total", "llama") == 3
    assert sample(metrics, "inferd:model_loads_total", "qwen2") == 2
    assert sample(metrics, "inferd:model_unloads_total", "llama") == 2
    assert sample(metrics, "inferd:model_unloads_total", "qwen2") == 2
    assert sample(metrics, "inferd:model_load_failures_total", "broken") == 1
    # the loaded model's own series, under its name, once per family (valid exposition text)
    assert 'model_name="llama"' in metrics
    types = [x for x in metrics.splitlines() if x.startswith("# TYPE")]
    assert len(types) == len(set(types))


def test_the_flags_that_cannot_mean_anything_are_refused(files):
    one = str(files / "llama.gguf")
    with pytest.raises(ValueError, match="already served as 'a'"):
        model_specs(parse("--model", f"a={one}", "--model", f"b={one}"))
    with pytest.raises(ValueError, match="give each as --model NAME=PATH"):
        serves_many(parse("--model", one, "--model", str(files / "qwen2.gguf")))
    with pytest.raises(ValueError, match="--max-loaded-models: only with several models"):
        serves_many(parse("--model", one, "--max-loaded-models", "2"))
    assert not serves_many(parse("--model", one))  # a single model: served as before
    with pytest.raises(ValueError, match="--chat-template: not with several models"):
        build_server(parse("--model", f"a={one}", "--chat-template", "{{ x }}"))
    with pytest.raises(ValueError, match="--ray: not with several models"):
        build_server(parse("--model", f"a={one}", "--ray"))
    with pytest.raises(ValueError, match="--max-loaded-memory: only with several models"):
        serves_many(parse("--model", one, "--max-loaded-memory", "1GiB"))


def test_a_memory_budget_on_a_gpu_needs_the_kv_pool_size(files, monkeypatch):
    import torch

    import inferd.platform

    monkeypatch.setattr(inferd.platform, "resolve_device", lambda name: torch.device("cuda"))
    one = str(files / "llama.gguf")
    with pytest.raises(ValueError, match="--max-loaded-memory on a GPU needs --kv-cache-memory"):
        build_server(parse("--model", f"a={one}", "--max-loaded-memory", "8GiB"))
    build_server(parse("--model", f"a={one}", "--max-loaded-memory", "8GiB",
                       "--kv-cache-memory", "1GiB"), loader=lambda n, p: None)  # fmt: skip


def card_of(http: TestClient, model: str) -> dict:
    return http.get(f"/v1/models/{model}").json()


def test_idle_unload_unloads_and_the_budget_counts_the_engines_own_kv_pool(files, monkeypatch):
    """--idle-unload with a short value: the model unloads by itself (its engine stopped, not
    dead); the KV pool estimated before the load is the one the engine allocates."""
    import time

    monkeypatch.setenv("INFERD_WEIGHT_CACHE", "0")
    args = parse("--model", f"llama={files / 'llama.gguf'}", "--model",
                 f"qwen2={files / 'qwen2.gguf'}", "--idle-unload", "0.3",
                 "--max-loaded-memory", "64GiB", *ENGINE)  # fmt: skip
    app, _ = build_server(args)
    with TestClient(app) as http:
        assert complete(http, "llama").status_code == 200
        loaded = card_of(http, "llama")
        assert loaded["state"] == "loaded" and loaded["memory"]["source"] == "measured"
        deadline = time.monotonic() + 30
        while card_of(http, "llama")["state"] != "available" and time.monotonic() < deadline:
            time.sleep(0.05)
        card = card_of(http, "llama")
        assert card["state"] == "available" and "last_error" not in card
        assert card["memory"]["source"] == "estimated"
        assert card["memory"]["kv_pool_bytes"] == loaded["memory"]["kv_pool_bytes"]
        budget = http.get("/v1/models").json()["budget"]
        assert budget["memory_used_bytes"] == 0 and budget["max_memory_bytes"] == 64 << 30
        metrics = http.get("/metrics").text
    assert sample(metrics, "inferd:model_unloads_total", "llama") == 1


@pytest.mark.slow  # four engine core processes start, one after the other (seconds each)
def test_data_parallel_replicas_per_model(files, alone, monkeypatch):
    """--data-parallel-size 2: each model its own two engine core processes; a request to each
    model gets that model's tokens, and switching stops the other model's cores."""
    monkeypatch.setenv("INFERD_WEIGHT_CACHE", "0")
    engine = [f for f in ENGINE if f != "--no-engine-core-process"]
    args = parse("--model", f"llama={files / 'llama.gguf'}", "--model",
                 f"qwen2={files / 'qwen2.gguf'}", "--data-parallel-size", "2",
                 "--max-loaded-models", "1", *engine)  # fmt: skip
    app, _ = build_server(args)
    with TestClient(app) as http:
        cores = {}
        for model in ("llama", "qwen2"):
            r = complete(http, model)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["token_ids"] == alone[model]
            slot = app.app.pool.slots[model]  # CORS → the dispatcher
            cores[model] = [r.process for r in slot.app.state.inferd.client.replicas]
            assert len(cores[model]) == 2
            assert card_of(http, model)["memory"]["processes"] == 2
        assert not any(core.alive for core in cores["llama"])  # unloaded for qwen2's seat
        assert "last_error" not in card_of(http, "llama")

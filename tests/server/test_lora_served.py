"""`inferd serve --enable-lora --lora-modules name=path` on a tiny random GGUF file (the core in
its own process): `/v1/models` lists each adapter with its parent, a request's `model` picks
the adapter, and its tokens are what the offline engine gives under the same adapter; with
`--allow-runtime-lora-updating`, adapters come and go by `/v1/load_lora_adapter` and
`/v1/unload_lora_adapter`."""

from __future__ import annotations

import httpx
import pytest
from lora_adapters import write_random_adapter
from server_helpers import ServerProcess
from tiny_gguf import write_tiny_gguf

from inferd import LLM, LoRARequest, SamplingParams

PROMPT = [2, 40, 41, 42, 43, 44, 45]


@pytest.fixture(scope="module")
def served(tmp_path_factory, c_kernels):
    root = tmp_path_factory.mktemp("lora-serve")
    path = root / "tiny-llama.gguf"
    write_tiny_gguf(path, "llama")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("INFERD_WEIGHT_CACHE", "0")
        llm = LLM(model=str(path), kv_cache_memory=32 << 20, enable_lora=True, max_loras=2)
    lora = llm.engine.runner.model.lora
    folders = [write_random_adapter(root / f"a{i}", lora.shapes(), 2, seed=i) for i in (1, 2)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    expected = {None: llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0].token_ids}
    for i, folder in enumerate(folders, start=1):
        out = llm.generate([PROMPT], params, use_tqdm=False,
                           lora_request=LoRARequest(f"a{i}", i, str(folder)))  # fmt: skip
        expected[f"a{i}"] = out[0].outputs[0].token_ids
    server = ServerProcess(str(path), "--kv-cache-memory", "32MiB", "--enable-lora",
                           "--max-loras", "1", "--lora-modules", f"a1={folders[0]}",
                           f"a2={folders[1]}", "--allow-runtime-lora-updating")  # fmt: skip
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=60) as http:
            yield http, expected, str(path), folders
    finally:
        server.stop()


def _tokens(http, model):
    body = {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
            "ignore_eos": True, "return_tokens_as_token_ids": True, "logprobs": 0}  # fmt: skip
    reply = http.post("/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    return [int(t.removeprefix("token_id:")) for t in reply.json()["choices"][0]["logprobs"]
            ["tokens"]]  # fmt: skip


def test_models_lists_adapters_with_their_parent(served):
    http, _, path, _ = served
    cards = {c["id"]: c for c in http.get("/v1/models").json()["data"]}
    assert cards["a1"]["parent"] == path and cards["a2"]["parent"] == path
    assert "parent" not in cards[path]
    assert http.get("/v1/models/a2").json()["root"].endswith("a2")


def test_the_model_field_picks_the_adapter(served):
    http, expected, path, _ = served
    # a1, a2, a1 again: one slot, so each switch evicts the other adapter
    for model in ("a1", "a2", path, "a1"):
        assert _tokens(http, model) == expected[None if model == path else model]
    assert expected["a1"] != expected[None] and expected["a2"] != expected["a1"]
    reply = http.post("/v1/completions", json={"model": "a3", "prompt": PROMPT})
    assert reply.status_code == 404 and "a1" in reply.text


def test_metrics_show_resident_adapters_and_requests_per_adapter(served):
    http, _, _, _ = served
    _tokens(http, "a2")
    text = http.get("/metrics").text
    lines = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
             for line in text.splitlines() if line.startswith("inferd:lora_")}  # fmt: skip
    resident = {k: v for k, v in lines.items() if "lora_adapter_resident" in k}
    assert sorted(resident.values()) == [0.0, 1.0]  # one slot: a2 in it, a1 evicted
    assert next(v for k, v in resident.items() if 'lora_name="a2"' in k) == 1.0
    served_a1 = next(v for k, v in lines.items() if "lora_requests_total" in k and '"a1"' in k)
    assert served_a1 >= 2


def test_adapters_load_and_unload_at_run_time(served):
    http, expected, _, folders = served
    loaded = http.post("/v1/load_lora_adapter", json={"lora_name": "again",
                                                      "lora_path": str(folders[1])})  # fmt: skip
    assert loaded.status_code == 200, loaded.text
    assert "again" in {c["id"] for c in http.get("/v1/models").json()["data"]}
    assert _tokens(http, "again") == expected["a2"]
    clash = http.post("/v1/load_lora_adapter", json={"lora_name": "a1", "lora_path": "/x"})
    missing = http.post("/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": "/nope"})
    assert clash.status_code == 400 and missing.status_code == 400
    assert "adapter_config.json" in missing.text
    assert http.post("/v1/unload_lora_adapter", json={"lora_name": "again"}).status_code == 200
    gone = http.post("/v1/completions", json={"model": "again", "prompt": PROMPT})
    assert gone.status_code == 404
    assert http.post("/v1/unload_lora_adapter", json={"lora_name": "again"}).status_code == 404

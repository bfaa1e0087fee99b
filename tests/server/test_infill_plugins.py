"""The stock editor plugins against `/infill`, unchanged (issue 56, item 6): the exact request
bodies llama.vim and llama.vscode send by default, replayed against a tiny random model trained
with Qwen2.5-Coder's FIM tokens, and each field checked for being honoured: the `infill`
sampler, `n_cmpl` (several completions of one prompt computed once, as an array; streamed by
index), the prompt-only warm-ups, `response_fields`, `n_indent`, `n_predict`."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

from inferd.server.app import create_app
from inferd.server.extra.infill_rules import indent_cut

CONTEXT_CHUNK = "import os\n\ndef helper(path):\n    return os.path.exists(path)\n"

# llama.vim (ggml-org/llama.vim, autoload/llama.vim, s:fim): the completion request with the
# plugin's default configuration (n_predict 128, stop_strings [], t_max_prompt_ms 500, the first
# request's t_max_predict_ms 250); `model` is sent empty ("model_fim": ""), `time` is reltime().
LLAMA_VIM_FIM = json.loads("""
{
  "id_slot": 0,
  "input_prefix": "def area(w, h):\\n",
  "input_suffix": "\\n\\nprint(area(2, 3))\\n",
  "input_extra": [{"text": "import os\\n\\ndef helper(path):\\n    return os.path.exists(path)\\n",
                   "time": [1733700000, 123456], "filename": "util.py"}],
  "prompt": "    ",
  "n_predict": 128,
  "stop": [],
  "n_indent": 4,
  "top_k": 40,
  "top_p": 0.90,
  "samplers": ["top_k", "top_p", "infill"],
  "stream": false,
  "cache_prompt": true,
  "t_max_prompt_ms": 500,
  "t_max_predict_ms": 250,
  "response_fields": ["content", "timings/prompt_n", "timings/prompt_ms",
                      "timings/prompt_per_token_ms", "timings/prompt_per_second",
                      "timings/predicted_n", "timings/predicted_ms",
                      "timings/predicted_per_token_ms", "timings/predicted_per_second",
                      "truncated", "tokens_cached"],
  "model": ""
}
""")

# llama.vim (s:ring_update): the context chunks sent ahead, prompt only, answer discarded.
LLAMA_VIM_RING_UPDATE = json.loads("""
{
  "id_slot": 0,
  "input_prefix": "",
  "input_suffix": "",
  "input_extra": [{"text": "import os\\n\\ndef helper(path):\\n    return os.path.exists(path)\\n",
                   "time": [1733700000, 123456], "filename": "util.py"}],
  "prompt": "",
  "n_predict": 0,
  "temperature": 0.0,
  "samplers": [],
  "stream": false,
  "cache_prompt": true,
  "t_max_prompt_ms": 1,
  "t_max_predict_ms": 1,
  "response_fields": [""],
  "model": ""
}
""")

# llama.vscode (ggml-org/llama.vscode, src/llama-server.ts, createRequestPayload): the
# completion request with the default settings (n_predict 128, max_parallel_completions 3,
# t_max_prompt_ms 500, t_max_predict_ms 2500; defaultRequestParams top_k 40, top_p 0.99, stream
# false, samplers ["top_k", "top_p", "infill"], cache_prompt true); n_indent is sent when the
# cursor line is indented; no `model`, no `lora` (lora_completion is empty by default).
LLAMA_VSCODE_FIM = json.loads("""
{
  "id_slot": 0,
  "input_prefix": "def area(w, h):\\n",
  "input_suffix": "\\n\\nprint(area(2, 3))\\n",
  "input_extra": [{"text": "import os\\n\\ndef helper(path):\\n    return os.path.exists(path)\\n",
                   "time": 1733700000123, "filename": "/home/me/project/util.py"}],
  "prompt": "",
  "n_predict": 128,
  "n_cmpl": 3,
  "top_k": 40,
  "top_p": 0.99,
  "stream": false,
  "samplers": ["top_k", "top_p", "infill"],
  "cache_prompt": true,
  "n_indent": 4,
  "t_max_prompt_ms": 500,
  "t_max_predict_ms": 2500
}
""")

# llama.vscode (updateExtraContext → createRequestPayload(noPredict=true)): the warm-up.
LLAMA_VSCODE_PREPARE = json.loads("""
{
  "id_slot": 0,
  "input_prefix": "",
  "input_suffix": "",
  "input_extra": [{"text": "import os\\n\\ndef helper(path):\\n    return os.path.exists(path)\\n",
                   "time": 1733700000123, "filename": "/home/me/project/util.py"}],
  "prompt": "",
  "n_predict": 0,
  "samplers": [],
  "cache_prompt": true,
  "t_max_prompt_ms": 500,
  "t_max_predict_ms": 1
}
""")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from tiny_models import make_tiny_checkpoint

    from inferd import LLM
    from inferd.engine.frontend.async_engine import AsyncEngine

    folder = make_tiny_checkpoint("llama", tmp_path_factory.mktemp("fim-plugins"), fim=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("INFERD_WEIGHT_CACHE", "0")
        llm = LLM(model=str(folder), kv_cache_memory=16 << 20, max_model_len=256)
    with TestClient(create_app(AsyncEngine(llm.engine))) as http:
        yield http


def prompt_tokens_computed(http) -> float:
    lines = http.get("/metrics").text.splitlines()
    return sum(float(x.rsplit(" ", 1)[1]) for x in lines
               if x.startswith("inferd:prompt_tokens_total"))  # fmt: skip


# The plugins' time limits (t_max_prompt_ms 500) depend on this machine's speed; the checks of
# what each other field does lift them (test_infill.py tests the limits themselves).
UNTIMED = {"t_max_prompt_ms": -1, "t_max_predict_ms": -1}
LLAMA_CPP_KEYS = {"index", "content", "stop", "model", "stop_type", "stopping_word",
                  "tokens_predicted", "tokens_evaluated", "tokens_cached", "truncated",
                  "timings"}  # fmt: skip


def test_the_bodies_as_the_plugins_send_them(served):
    warm = served.post("/infill", json=LLAMA_VIM_RING_UPDATE)
    assert warm.status_code == 200 and warm.json() == {}, warm.text  # response_fields [""]
    r = served.post("/infill", json=LLAMA_VIM_FIM)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == set(LLAMA_VIM_FIM["response_fields"])  # flat paths, as llama.cpp's
    assert isinstance(body["content"], str) and body["truncated"] is False
    prepare = served.post("/infill", json=LLAMA_VSCODE_PREPARE)
    assert prepare.status_code == 200, prepare.text
    assert set(prepare.json()) == LLAMA_CPP_KEYS and prepare.json()["content"] == ""
    r = served.post("/infill", json=LLAMA_VSCODE_FIM)
    assert r.status_code == 200, r.text
    answers = r.json()  # n_cmpl 3: an array, as llama.vscode's getComplFromContent reads it
    assert isinstance(answers, list) and [a["index"] for a in answers] == [0, 1, 2]
    assert all(set(a) == LLAMA_CPP_KEYS and a["stop"] is True for a in answers)


def test_llama_vim_fields_are_honoured(served):
    served.post("/infill", json={**LLAMA_VIM_RING_UPDATE, **UNTIMED})
    body = served.post("/infill", json={**LLAMA_VIM_FIM, **UNTIMED}).json()
    assert body["timings/predicted_n"] <= LLAMA_VIM_FIM["n_predict"]
    assert indent_cut(body["content"], 0, LLAMA_VIM_FIM["n_indent"]) is None
    # The context chunk sent ahead is in the prefix cache: the FIM prompt starts with it.
    assert body["tokens_cached"] > 0 and body["timings/prompt_n"] > 0


def test_the_infill_sampler_ends_a_reply_nothing_is_likely_enough_for(served):
    # A random model spreads its probability over many tokens: after top_k 40 no candidate
    # reaches 0.2 (or EOS is among them, weighed by 3 x 40), so the infill sampler ends the
    # reply at its first token; without it, the same chain samples text.
    body = {**LLAMA_VIM_FIM, **UNTIMED, "response_fields": [], "n_indent": 0, "seed": 5}
    whole = served.post("/infill", json=body).json()
    assert whole["content"] == "" and whole["stop_type"] == "eos", whole
    assert whole["tokens_predicted"] == 1
    plain = served.post("/infill", json={**body, "samplers": ["top_k", "top_p"], "n_predict": 8})
    assert plain.json()["tokens_predicted"] > 1, plain.text
    refused = served.post("/infill", json={**body, "samplers": ["infill", "top_k", "top_p"]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "samplers"
    no_top_k = served.post("/infill", json={**body, "top_k": 0, "samplers": ["top_p", "infill"]})
    assert no_top_k.status_code == 400 and no_top_k.json()["error"]["param"] == "top_k"


def test_llama_vscode_n_cmpl_computes_the_prompt_once(served):
    before = prompt_tokens_computed(served)
    answers = served.post("/infill", json={**LLAMA_VSCODE_FIM, **UNTIMED}).json()
    assert [a["index"] for a in answers] == [0, 1, 2]
    for a in answers:
        assert a["tokens_evaluated"] == answers[0]["tokens_evaluated"] > 0
        assert a["tokens_predicted"] <= LLAMA_VSCODE_FIM["n_predict"]
    computed = prompt_tokens_computed(served) - before
    assert computed == answers[0]["timings"]["prompt_n"] > 0


def test_n_cmpl_samples_several_completions_of_one_prompt(served):
    body = {**LLAMA_VSCODE_FIM, **UNTIMED, "samplers": ["top_k", "top_p"], "n_indent": 0,
            "n_predict": 6, "seed": 3, "ignore_eos": True}  # fmt: skip
    answers = served.post("/infill", json=body).json()
    assert len(answers) == 3 and all(a["tokens_predicted"] == 6 for a in answers)
    assert len({a["content"] for a in answers}) > 1  # distinct samples (seed + i each)
    again = served.post("/infill", json=body).json()
    assert [a["content"] for a in again] == [a["content"] for a in answers]  # seeded
    # `n` is n_cmpl's alias; a single completion is an object, not an array.
    alias = served.post("/infill", json={**{k: v for k, v in body.items() if k != "n_cmpl"},
                                         "n": 2}).json()  # fmt: skip
    assert [a["index"] for a in alias] == [0, 1]
    one = served.post("/infill", json={**body, "n_cmpl": 1}).json()
    assert isinstance(one, dict) and one["content"] == answers[0]["content"]
    for count in (0, 1000):  # 1000: past the engine's limit on samples (128)
        bad = served.post("/infill", json={**body, "n_cmpl": count})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "n_cmpl", bad.text
    # Streamed: pieces and one last event per completion, told apart by their index.
    streamed = served.post("/infill", json={**body, "stream": True})
    events = [json.loads(x[6:]) for x in streamed.text.splitlines() if x.startswith("data:")]
    for a in answers:
        mine = [e for e in events if e["index"] == a["index"]]
        assert [e["stop"] for e in mine].count(True) == 1 and mine[-1]["stop"]
        assert "".join(e["content"] for e in mine) == a["content"]
        assert mine[-1]["tokens_predicted"] == 6


@pytest.mark.slow
def test_through_a_server_with_its_engine_core_process(tmp_path, monkeypatch):
    """`inferd serve` as users run it (the engine core in its own process): the infill flag
    crosses with the request's params, the core reads token texts from its own vocabulary."""
    import httpx
    from server_helpers import start_server
    from tiny_models import make_tiny_checkpoint

    folder = make_tiny_checkpoint("llama", tmp_path, fim=True)
    monkeypatch.setenv("INFERD_WEIGHT_CACHE", "0")
    server = start_server("--model", str(folder), "--max-model-len", "256")
    try:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            body = {**LLAMA_VIM_FIM, **UNTIMED, "response_fields": [], "n_indent": 0, "seed": 5}
            whole = http.post("/infill", json=body).json()
            assert whole["stop_type"] == "eos" and whole["tokens_predicted"] == 1, whole
            answers = http.post("/infill", json={**LLAMA_VSCODE_FIM, **UNTIMED}).json()
            assert [a["index"] for a in answers] == [0, 1, 2], answers
    finally:
        server.stop()

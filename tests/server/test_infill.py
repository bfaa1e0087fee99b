"""Fill-in-the-middle (issue 56, item 6): the model's FIM tokens found by name (HF) or by GGUF
metadata, the prompt's exact token ids, llama.cpp's `/infill` and OpenAI's `suffix` end to end
on a tiny random model trained with Qwen2.5-Coder's FIM tokens, and the 400 of a model without
them (the embedded Gemma 3 270M has none)."""

from __future__ import annotations

import json

import pytest
from fake_client import ScriptedClient
from starlette.testclient import TestClient
from tiny_gguf import write_tiny_gguf
from tiny_models import FIM_SPECIALS, train_tokenizer

from inferd.server.app import create_app
from inferd.server.generation.infill_prompt import ContextFile, infill_ids
from inferd.tokenizer.fim import FIMTokens, fim_tokens
from inferd.tokenizer.tokenizer import Tokenizer, load_tokenizer

PRE, SUF, MID, PAD, REP, SEP = range(4, 10)  # FIM_SPECIALS' ids after <unk> <s> </s> <pad>


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fim-tok")
    train_tokenizer(folder, fim=True)
    return Tokenizer.from_hf_dir(folder)


def test_fim_tokens_by_name_and_by_gguf_metadata(tok, tmp_path):
    assert [tok.token_to_id(t) for t in FIM_SPECIALS] == [PRE, SUF, MID, PAD, REP, SEP]
    assert fim_tokens(tok) == FIMTokens(PRE, SUF, MID, PAD, REP, SEP)
    # Names no family uses: only the metadata's tokenizer.ggml.fim_*_token_id keys find them.
    write_tiny_gguf(tmp_path / "m.gguf", "llama", fim="metadata")
    assert fim_tokens(load_tokenizer(tmp_path / "m.gguf")) == FIMTokens(3, 4, 5, 6, 7, 8)


def test_the_prompt_is_prefix_suffix_middle_in_token_ids(tok):
    def text(s):
        return tok.encode(s, add_special_tokens=False)

    fim = fim_tokens(tok)
    ids = infill_ids(tok, fim, "def f(x):\n    ", "\n    return y", "y =")
    assert ids == [1, PRE, *text("def f(x):\n    "), SUF, *text("\n    return y"), MID,
                   *text("y =")]  # fmt: skip
    # Context files in the repo-level format; special-token strings typed as code stay text.
    files = [ContextFile("a.py", "import os")]
    ids = infill_ids(tok, fim, "<|fim_middle|>", "", files=files, add_special_tokens=False)
    assert ids == [REP, *text("project\n"), SEP, *text("a.py\nimport os"), SEP,
                   *text("current\n"), PRE, *tok.encode("<|fim_middle|>", False, True), SUF,
                   MID]  # fmt: skip
    assert MID not in ids[ids.index(PRE) : ids.index(SUF)]
    # Codestral: suffix first, no middle token; the prompt continues the prefix.
    codestral = FIMTokens(PRE, SUF, None, suffix_first=True)
    ids = infill_ids(tok, codestral, "a", "b", "c", add_special_tokens=False)
    assert ids == [SUF, *text("b"), PRE, *text("ac")]


def test_a_model_without_fim_tokens_is_a_400_on_both_routes():
    with TestClient(create_app(ScriptedClient())) as http:
        infill = http.post("/infill", json={"input_prefix": "a", "input_suffix": "b"})
        suffix = http.post("/v1/completions", json={"prompt": "a", "suffix": "b"})
        plain = http.post("/v1/completions", json={"prompt": "a", "suffix": ""})
    for reply, param in ((infill, "input_prefix"), (suffix, "suffix")):
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == param and "no fill-in-the-middle tokens" in error["message"]
    assert plain.status_code == 200  # an empty suffix is OpenAI's default: no FIM asked for


def test_the_embedded_model_has_no_fim_tokens():
    from inferd.loader.default_model import default_model_path

    assert fim_tokens(load_tokenizer(default_model_path())) is None


@pytest.fixture(scope="module")
def served(tmp_path_factory, tok):
    from tiny_models import make_tiny_checkpoint

    from inferd import LLM
    from inferd.engine.frontend.async_engine import AsyncEngine

    folder = make_tiny_checkpoint("llama", tmp_path_factory.mktemp("fim-model"), fim=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("INFERD_WEIGHT_CACHE", "0")
        llm = LLM(model=str(folder), kv_cache_memory=16 << 20, max_model_len=256)
    with TestClient(create_app(AsyncEngine(llm.engine))) as http:
        yield http


def test_infill_and_suffix_complete_through_the_server(served, tok):
    body = {"input_prefix": "def f(x):\n", "input_suffix": "\nreturn y", "n_predict": 4,
            "temperature": 0, "ignore_eos": True,
            "input_extra": [{"filename": "a.py", "text": "import os"}]}  # fmt: skip
    r = served.post("/infill", json=body)
    assert r.status_code == 200, r.text
    whole = r.json()
    assert whole["stop"] and whole["stop_type"] == "limit" and whole["tokens_predicted"] == 4
    expected = infill_ids(tok, fim_tokens(tok), "def f(x):\n", "\nreturn y",
                          files=[ContextFile("a.py", "import os")])  # fmt: skip
    assert whole["tokens_evaluated"] == len(expected)
    streamed = served.post("/infill", json={**body, "stream": True})
    events = [
        json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data:")
    ]
    assert events[-1]["stop"] and not any(e["stop"] for e in events[:-1])
    assert "".join(e["content"] for e in events) == whole["content"]
    # OpenAI's suffix: the prompt is the prefix; the engine got exactly the FIM prompt's ids.
    fim_body = {"prompt": "def f(x):\n", "suffix": "\nreturn y", "max_tokens": 4,
                "temperature": 0, "ignore_eos": True, "return_token_ids": True}  # fmt: skip
    r = served.post("/v1/completions", json=fim_body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["prompt_token_ids"] == infill_ids(tok, fim_tokens(tok), "def f(x):\n",
                                                    "\nreturn y")  # fmt: skip
    assert len(choice["token_ids"]) == 4

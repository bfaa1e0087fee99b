"""Fill-in-the-middle (issue 56, item 6): the model's FIM tokens found by name (HF) or by GGUF
metadata, the prompt's exact token ids, llama.cpp's `/infill` and OpenAI's `suffix` end to end
on a tiny random model trained with Qwen2.5-Coder's FIM tokens, and the 400 of a model without
them (the embedded Gemma 3 270M has none)."""

from __future__ import annotations

import json
import time

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


# What llama.vim / llama.vscode send (issue: /infill for editor plugins): each field honoured as
# llama.cpp's server defines it, or refused naming it.

from inferd.errors import InvalidRequest  # noqa: E402
from inferd.sampling_params import SamplingParams  # noqa: E402
from inferd.server.extra.infill_rules import check_samplers, indent_cut, pick_fields  # noqa: E402


def test_n_indent_cuts_the_first_line_indented_less_than_asked():
    text = "x = 1\n    y = 2\nz = 3\n"
    cut = indent_cut(text, 0, 4)
    assert text[:cut] == "x = 1\n    y = 2\n"  # llama.cpp keeps the line break, cuts the line
    assert indent_cut("a\n    b\n  ", 0, 4) is None  # the last line's indentation is not known
    assert indent_cut("a\n\nb", 0, 1) == 2  # an empty line ends it too (a line break is text)
    assert indent_cut("no line break at all", 0, 8) is None  # the first line is never checked
    assert indent_cut("a\nb", 0, 0) is None


def test_response_fields_pick_paths_as_llama_cpp():
    answer = {"content": "x", "timings": {"prompt_n": 3}, "truncated": False}
    assert pick_fields(answer, ["content", "timings/prompt_n", "timings/nope", "missing"]) == {
        "content": "x", "timings/prompt_n": 3}  # fmt: skip
    assert pick_fields(answer, [""]) == {}
    assert pick_fields(answer, []) == answer


def test_sampler_chains_inferd_can_and_cannot_reproduce():
    def check(chain, **kw):
        check_samplers(chain, SamplingParams(**kw), samples=True)

    check(["top_k", "top_p", "infill"], top_k=40, top_p=0.9)  # llama.vim's
    check(
        [
            "penalties",
            "dry",
            "top_n_sigma",
            "top_k",
            "typ_p",
            "top_p",
            "min_p",
            "xtc",
            "temperature",
        ],
        top_k=40,
        temperature=0.0,
    )  # llama.cpp's default chain, greedy
    check(["top_k", "temperature"], top_k=40, temperature=0.7)  # they commute
    check(["top_p", "temperature"], top_p=0.9)  # temperature 1 does nothing: any place
    check_samplers([], SamplingParams(temperature=0.0), samples=False)  # n_predict 0
    refusals = [
        (["infill", "top_k"], {"top_k": 40}, "before 'top_k'"),  # infill filters last
        (["nucleus"], {}, "unknown sampler"),
        (["top_k"], {"top_k": 40, "top_p": 0.9}, "leaves out 'top_p'"),
        ([], {"temperature": 0.0}, "leaves out 'temperature'"),
        (["top_p", "top_k"], {"top_k": 40, "top_p": 0.9}, "before 'top_k'"),
        (["top_p", "temperature"], {"top_p": 0.9, "temperature": 0.5}, "before 'temperature'"),
    ]
    for chain, kw, words in refusals:
        with pytest.raises(InvalidRequest) as e:
            check(chain, **kw)
        assert e.value.param == "samplers" and words in str(e.value), (chain, str(e.value))


LLAMA_VIM_FIELDS = ["content", "timings/prompt_n", "timings/prompt_ms",
                    "timings/prompt_per_token_ms", "timings/prompt_per_second",
                    "timings/predicted_n", "timings/predicted_ms",
                    "timings/predicted_per_token_ms", "timings/predicted_per_second",
                    "truncated", "tokens_cached"]  # fmt: skip


def test_llama_vim_and_llama_vscode_bodies_through_the_server(served):
    extra = [{"text": "import os\n", "time": [1, 2], "filename": "a.py"}]
    body = {"id_slot": 0, "input_prefix": "def f(x):\n", "input_suffix": "\n", "input_extra":
            extra, "prompt": "    ", "n_predict": 8, "stop": [], "n_indent": 4, "top_k": 40,
            "top_p": 0.90, "samplers": ["top_k", "top_p"], "stream": False,
            "cache_prompt": True, "t_max_prompt_ms": 60000, "t_max_predict_ms": 60000,
            "response_fields": LLAMA_VIM_FIELDS, "n_cmpl": 1}  # fmt: skip
    r = served.post("/infill", json=body)
    assert r.status_code == 200, r.text
    assert set(r.json()) == set(LLAMA_VIM_FIELDS)  # flat keys, as llama.cpp's
    # The warm-up request: the prompt only (context files into the cache), no answer fields.
    warm = {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": extra,
            "prompt": "", "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False,
            "cache_prompt": True, "t_max_prompt_ms": 60000, "t_max_predict_ms": 1,
            "response_fields": [""]}  # fmt: skip
    r = served.post("/infill", json=warm)
    assert r.status_code == 200 and r.json() == {}, r.text
    whole = served.post("/infill", json={**warm, "response_fields": []}).json()
    assert whole["content"] == "" and whole["tokens_predicted"] == 0
    assert whole["stop_type"] == "limit" and whole["tokens_cached"] > 0
    for field, value, words in (("id_slot", 1, "no slots"), ("n_cmpl", 0, ">= 1"),
                                ("samplers", ["top_p", "top_k"], "before 'top_k'")):  # fmt: skip
        r = served.post("/infill", json={**body, field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
        assert words in r.json()["error"]["message"]


def test_the_time_limits_end_the_request_with_limit(served):
    # No token can come within 1 µs-ish of arrival: the prompt's limit ends it, empty.
    prefix = "def f(x):\n" + "    x = x + 1\n" * 12
    body = {"input_prefix": prefix, "input_suffix": "\n", "n_predict": 64, "ignore_eos": True,
            "temperature": 0, "t_max_prompt_ms": 1}  # fmt: skip
    computed = _prompt_tokens_computed(served)
    r = served.post("/infill", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["stop_type"] == "limit" and r.json()["content"] == ""
    # The answer came at the limit, but the prompt is computed all the same (a warm-up fills
    # the prefix cache): the same request then finds it cached.
    deadline = time.monotonic() + 30
    while _prompt_tokens_computed(served) == computed and time.monotonic() < deadline:
        time.sleep(0.01)
    again = served.post("/infill", json={**body, "t_max_prompt_ms": 0, "n_predict": 1})
    assert again.json()["tokens_cached"] > 0, again.text


def _prompt_tokens_computed(served) -> float:
    lines = served.get("/metrics").text.splitlines()
    return sum(float(x.rsplit(" ", 1)[1]) for x in lines
               if x.startswith("inferd:prompt_tokens_total"))  # fmt: skip


def test_an_answer_at_the_prompt_limit_lets_the_prompt_finish_first():
    """t_max_prompt_ms: the route answers, the group's abort waits for the first token."""
    import asyncio
    from types import SimpleNamespace

    from inferd.server.generation.serving import RequestGroup

    aborted = []
    client = SimpleNamespace(abort=aborted.append)

    def output(tokens, finished=False):
        sample = SimpleNamespace(token_ids=tokens)
        return SimpleNamespace(request_id="r", outputs=[sample], finished=finished, error=None)

    async def scenario():
        group = RequestGroup(client)
        group.request_ids, group._open = ["r"], {"r"}
        group.finish_prompts()
        group.abort()  # the route's own abort on its way out: deferred
        await asyncio.sleep(0)
        assert aborted == []
        group.queue.put_nowait(output([]))  # a prompt chunk: no token yet
        await asyncio.sleep(0.01)
        assert aborted == []
        group.queue.put_nowait(output([5]))  # the first token: the prompt is computed
        await asyncio.sleep(0.01)
        assert aborted == ["r"] and group.closed

    asyncio.run(scenario())

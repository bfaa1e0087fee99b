"""`inferd export-tokenizer MODEL DIR` writes an HF tokenizer folder that
`transformers.AutoTokenizer` loads offline and that tokenizes exactly as the server's `/tokenize`
(plain text with and without special tokens, special-token strings, the chat template), and
`/tokenizer_info` describes the same tokenizer (vLLM's route); HEAD works on every GET route
(issue 27, item 5). The tiny tokenizer runs without a model; the served models' checks run
against the session servers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fake_client import ScriptedClient
from starlette.testclient import TestClient
from tiny_models import train_tokenizer

from inferd.server.app import create_app
from inferd.tokenizer import Tokenizer
from inferd.tokenizer.hf_export import FILES, export_tokenizer

TEXTS = ["Hello world", "  two spaces\n\ttab", "emoji 😀 ünïcödé", "a" * 40, "x"]
CHATS = {  # per served model: its template's roles (Gemma has no system turn)
    "server": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
               {"role": "user", "content": "And 3+3?"}],
    "chat_server": [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "What is 2+2?"}],
}  # fmt: skip
SPECIALS = {"server": "<start_of_turn>user\nhi<end_of_turn>", "chat_server": "<|im_start|>hi"}
NAMES = {"server": "gemma-3-270m", "chat_server": "smollm2-135m-instruct"}


def hf_tokenizer(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def chat_ids(hf, messages) -> list[int]:
    ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_a_tiny_tokenizer_exports_to_a_folder_hf_reads_alike(tmp_path):
    (tmp_path / "model").mkdir()
    train_tokenizer(tmp_path / "model")
    ours = Tokenizer.from_hf_dir(tmp_path / "model")
    written = export_tokenizer(ours, tmp_path / "out")
    assert [p.name for p in written] == list(FILES)
    hf = hf_tokenizer(tmp_path / "out")
    for text in [*TEXTS, "<s> a </s>"]:
        for special in (True, False):
            assert hf.encode(text, add_special_tokens=special) == ours.encode(text, special)
    messages = [{"role": "user", "content": "hi"}]
    assert chat_ids(hf, messages) == ours.chat_prompt(messages)[1]
    config = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    assert config["chat_template"] == ours.chat_template and config["eos_token"] == "</s>"


def test_export_refuses_a_file_as_the_folder(tmp_path):
    train_tokenizer(tmp_path)
    (tmp_path / "taken").write_text("")
    with pytest.raises(ValueError, match="is not a folder"):
        export_tokenizer(Tokenizer.from_hf_dir(tmp_path), tmp_path / "taken")


def test_tokenizer_info_needs_a_tokenizer_that_can_describe_itself():
    with TestClient(create_app(ScriptedClient())) as http:
        r = http.get("/tokenizer_info")
    assert r.status_code == 501 and r.json()["error"]["code"] == "not_implemented"


@pytest.mark.slow
@pytest.mark.parametrize("which", ["server", "chat_server"])
def test_the_exported_tokenizer_tokenizes_as_the_server(request, tmp_path, which):
    served = request.getfixturevalue(which)
    import httpx

    http = httpx.Client(base_url=served.url, headers=served.headers(), timeout=120)
    command = [sys.executable, "-m", "inferd", "export-tokenizer", NAMES[which], str(tmp_path)]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    hf = hf_tokenizer(tmp_path)
    for text in [*TEXTS, SPECIALS[which]]:
        for special in (True, False):
            body = {"prompt": text, "add_special_tokens": special}
            assert (
                hf.encode(text, add_special_tokens=special)
                == http.post("/tokenize", json=body).json()["tokens"]
            ), (text, special)
    messages = CHATS[which]
    served_ids = http.post("/tokenize", json={"messages": messages}).json()["tokens"]
    assert chat_ids(hf, messages) == served_ids
    info = http.get("/tokenizer_info").json()
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert info["tokenizer_class"] == config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert info["chat_template"] == config["chat_template"] and info["eos_token"] == hf.eos_token
    assert info["model_max_length"] == http.get("/v1/models").json()["data"][0]["max_model_len"]
    http.close()


@pytest.mark.slow
def test_head_answers_every_get_route_without_a_body(http):
    for path in ("/metrics", "/health", "/v1/models", "/version", "/tokenizer_info"):
        head, get = http.head(path), http.get(path)
        assert head.status_code == get.status_code == 200, path
        assert head.content == b"" and head.headers["content-length"] == str(len(get.content))
    assert http.head("/v1/completions").status_code == 405

"""`inferd serve smollm2-135m-instruct` answers a plain chat question under the model's short
name, greedy, as the offline API does (tests/parity/test_chat_model.py), with its content given
as a string or as text parts (its ChatML template wants strings: the parts are joined). Runs
when the model is in the cache (the README's test command, which CI runs, pulls it first)."""

from __future__ import annotations

import pytest

QUESTION = "What is the capital of France?"


@pytest.mark.parametrize(
    "content", [QUESTION, [{"type": "text", "text": QUESTION}]], ids=["string", "parts"]
)
def test_served_chat_model_answers_paris_under_its_name(chat_http, content):
    body = {"model": "smollm2-135m-instruct", "temperature": 0, "max_tokens": 24,
            "messages": [{"role": "user", "content": content}]}  # fmt: skip
    r = chat_http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "smollm2-135m-instruct"
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == "The capital of France is Paris."
    assert choice["finish_reason"] == "stop"


def test_the_openai_sdk_sends_content_parts(chat_server):
    from openai import OpenAI
    from server_helpers import API_KEY

    client = OpenAI(base_url=chat_server.url + "/v1", api_key=API_KEY, max_retries=0)
    parts = [
        {"type": "text", "text": "What is the capital"},
        {"type": "text", "text": "of France?"},
    ]
    messages = [{"role": "user", "content": parts}]
    r = client.chat.completions.create(
        model="smollm2-135m-instruct", temperature=0, max_tokens=24, messages=messages
    )
    assert "Paris" in r.choices[0].message.content


def test_served_embeddings_equal_the_offline_api(chat_server):
    """`/v1/embeddings` on the chat model (the openai SDK, base64 by default) gives the vectors
    `LLM.embed` gives offline: SmolLM2's 576 values, unit length, batch or alone."""
    from openai import OpenAI
    from server_helpers import API_KEY

    from inferd import LLM

    client = OpenAI(base_url=chat_server.url + "/v1", api_key=API_KEY, max_retries=0)
    texts = ["Paris is the capital of France.", "def add(a, b): return a + b"]
    served = client.embeddings.create(model="smollm2-135m-instruct", input=texts)
    llm = LLM(model="smollm2-135m-instruct", kv_cache_memory=64 << 20)
    offline = llm.embed(texts, use_tqdm=False)
    for item, out in zip(served.data, offline, strict=True):
        assert len(item.embedding) == 576
        assert max(abs(a - b) for a, b in zip(item.embedding, out.outputs.embedding)) < 1e-4
    assert served.usage.prompt_tokens == sum(len(o.prompt_token_ids) for o in offline)

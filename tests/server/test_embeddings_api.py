"""`/v1/embeddings` through the official `openai` client against the shared server (the
embedded model, served with `--pooler-config '{"matryoshka_dimensions": [64, 128]}'`): the
input shapes, float and base64, `dimensions`, batches, usage, and the refusals."""

from __future__ import annotations

import base64
import math
import struct

import openai
import pytest

HIDDEN = 640  # the embedded model's embedding size


def norm(vector: list[float]) -> float:
    return math.sqrt(sum(x * x for x in vector))


def assert_close(a: list[float], b: list[float], tol: float = 1e-5) -> None:
    assert len(a) == len(b)
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < tol


def token_ids(http, text: str) -> list[int]:
    return http.post("/tokenize", json={"prompt": text}).json()["tokens"]


def test_one_string(client, model_name, http):
    out = client.embeddings.create(model=model_name, input="The capital of France is Paris.",
                                   encoding_format="float")  # fmt: skip
    assert out.object == "list" and out.model == model_name and len(out.data) == 1
    item = out.data[0]
    assert item.object == "embedding" and item.index == 0
    assert len(item.embedding) == HIDDEN
    assert norm(item.embedding) == pytest.approx(1.0, abs=1e-5)  # normalised by default
    n = len(token_ids(http, "The capital of France is Paris."))
    assert out.usage.prompt_tokens == n and out.usage.total_tokens == n


def test_base64_is_the_float32_bytes_of_the_vector(client, model_name, http):
    text = "Embeddings travel as base64."
    floats = client.embeddings.create(model=model_name, input=text, encoding_format="float")
    # The client's default: it asks for base64 and decodes it itself.
    decoded = client.embeddings.create(model=model_name, input=text)
    assert_close(decoded.data[0].embedding, floats.data[0].embedding)
    raw = http.post("/v1/embeddings", json={"model": model_name, "input": text,
                                             "encoding_format": "base64"}).json()  # fmt: skip
    data = base64.b64decode(raw["data"][0]["embedding"])
    assert len(data) == 4 * HIDDEN
    assert_close(list(struct.unpack(f"<{HIDDEN}f", data)), floats.data[0].embedding)


def test_batch_inputs_in_order_and_like_single_requests(client, model_name):
    texts = ["A cat sat on the mat.", "Quantum chromodynamics", "A cat sat on the mat."]
    batch = client.embeddings.create(model=model_name, input=texts, encoding_format="float")
    assert [d.index for d in batch.data] == [0, 1, 2]
    vectors = [d.embedding for d in batch.data]
    assert_close(vectors[0], vectors[2])
    assert max(abs(x - y) for x, y in zip(vectors[0], vectors[1], strict=True)) > 1e-2
    alone = client.embeddings.create(model=model_name, input=texts[1], encoding_format="float")
    assert_close(alone.data[0].embedding, vectors[1], tol=1e-4)
    assert batch.usage.prompt_tokens > alone.usage.prompt_tokens


def test_token_id_inputs_equal_their_text(client, model_name, http):
    text = "Token ids or text: the same embedding."
    ids = token_ids(http, text)
    by_text = client.embeddings.create(model=model_name, input=text, encoding_format="float")
    one = client.embeddings.create(model=model_name, input=ids, encoding_format="float")
    many = client.embeddings.create(model=model_name, input=[ids, ids[:3]],
                                    encoding_format="float")  # fmt: skip
    assert_close(one.data[0].embedding, by_text.data[0].embedding, tol=1e-4)
    assert_close(many.data[0].embedding, by_text.data[0].embedding, tol=1e-4)
    assert len(many.data) == 2 and many.usage.prompt_tokens == len(ids) + 3


def test_dimensions_cut_then_normalise(client, model_name):
    text = "Matryoshka embeddings nest."
    full = client.embeddings.create(model=model_name, input=text, encoding_format="float",
                                    extra_body={"normalize": False})  # fmt: skip
    cut = client.embeddings.create(model=model_name, input=text, dimensions=64,
                                   encoding_format="float")  # fmt: skip
    prefix = full.data[0].embedding[:64]
    assert len(cut.data[0].embedding) == 64
    assert_close(cut.data[0].embedding, [x / norm(prefix) for x in prefix], tol=1e-4)
    assert norm(full.data[0].embedding) != pytest.approx(1.0, abs=1e-3)  # really unnormalised


def bad_request(client, model_name, **kwargs) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=model_name, encoding_format="float", **kwargs)
    return info.value


def test_refusals_name_the_parameter(client, model_name):
    e = bad_request(client, model_name, input="x", dimensions=100)
    assert e.body["param"] == "dimensions" and "64, 128 or 640" in e.body["message"]
    e = bad_request(client, model_name, input="x", extra_body={"temperature": 0.5})
    assert e.body["param"] == "temperature" and "generation parameter" in e.body["message"]
    e = bad_request(client, model_name, input="x", extra_body={"max_tokens": 4})
    assert e.body["param"] == "max_tokens"
    e = bad_request(client, model_name, input="x", extra_body={"frobnicate": 1})
    assert e.body["message"] == "unsupported parameter: frobnicate"
    e = bad_request(client, model_name, input=["fine", ""])
    assert e.body["param"] == "input" and "input[1]" in e.body["message"]
    e = bad_request(client, model_name, input=[])
    assert e.body["param"] == "input"
    e = bad_request(client, model_name, input=[5, 10**9])
    assert e.body["param"] == "input" and "outside the vocabulary" in e.body["message"]
    e = bad_request(client, model_name, input="x", dimensions=0)
    assert e.body["param"] == "dimensions"
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="no-such-model", input="x")


def test_encoding_format_and_user(http, model_name):
    r = http.post("/v1/embeddings", json={"model": model_name, "input": "x",
                                           "encoding_format": "int8"})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["param"] == "encoding_format"
    r = http.post("/v1/embeddings", json={"model": model_name, "input": "x", "user": "u-1"})
    assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == HIDDEN


def test_vllm_extras_act_on_the_input(client, model_name, http):
    text = "Only the last tokens count here."
    ids = token_ids(http, text)
    plain = client.embeddings.create(model=model_name, input=text, encoding_format="float",
                                     extra_body={"add_special_tokens": False})  # fmt: skip
    assert plain.usage.prompt_tokens == len(ids) - 1  # no BOS
    no_bos = client.embeddings.create(model=model_name, input=ids[1:], encoding_format="float")
    assert_close(plain.data[0].embedding, no_bos.data[0].embedding, tol=1e-4)
    cut = client.embeddings.create(model=model_name, input=text, encoding_format="float",
                                   extra_body={"truncate_prompt_tokens": 3})  # fmt: skip
    assert cut.usage.prompt_tokens == 3
    tail = client.embeddings.create(model=model_name, input=ids[-3:], encoding_format="float")
    assert_close(cut.data[0].embedding, tail.data[0].embedding, tol=1e-4)

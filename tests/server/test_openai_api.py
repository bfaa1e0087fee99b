"""The official `openai` client against a real `inferd serve` (embedded model): completions,
chat, streaming, n > 1, several prompts, logprobs, echo, stop strings, usage."""

from __future__ import annotations

import pytest

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three colours."}]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def greedy(client, model_name):
    """One greedy completion reused by several tests (generation costs seconds here)."""
    return client.completions.create(model=model_name, prompt=PROMPT, max_tokens=12,
                                     temperature=0)  # fmt: skip


def test_models_lists_the_served_model(client, model_name):
    [model] = client.models.list().data
    assert model.id == model_name and model.object == "model"
    assert model.model_extra["max_model_len"] > 0


def test_completion_fields_and_usage(greedy, http):
    assert greedy.id.startswith("cmpl-") and greedy.object == "text_completion"
    assert greedy.system_fingerprint.startswith("fp_") and greedy.created > 0
    [choice] = greedy.choices
    assert choice.index == 0 and choice.finish_reason == "length" and choice.text.strip()
    prompt_tokens = http.post("/tokenize", json={"prompt": PROMPT}).json()["count"]
    u = greedy.usage
    assert (u.prompt_tokens, u.completion_tokens) == (prompt_tokens, 12)
    assert u.total_tokens == prompt_tokens + 12


def test_streamed_completion_equals_the_plain_one_at_temperature_0(client, model_name, greedy):
    stream = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=12,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True})  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == greedy.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and not any(finishes[:-1])
    assert len(chunks) > 3  # streamed token by token, not in one piece
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert len({c.id for c in chunks}) == 1


def test_chat_plain_and_streamed_agree(client, model_name, http):
    plain = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=10,
                                           temperature=0)  # fmt: skip
    assert plain.object == "chat.completion" and plain.id.startswith("chatcmpl-")
    message = plain.choices[0].message
    assert message.role == "assistant" and message.content
    rendered = http.post("/tokenize", json={"messages": CHAT}).json()["count"]
    assert plain.usage.prompt_tokens == rendered
    stream = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=10,
                                            temperature=0, stream=True)  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == message.content
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason


def test_n2_with_several_prompts_maps_to_indexed_choices(client, model_name):
    r = client.completions.create(model=model_name, prompt=["Once upon a time", "1, 2, 3,"],
                                  n=2, max_tokens=4, temperature=1.0, seed=11)  # fmt: skip
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert all(c.finish_reason in ("length", "stop") and c.text for c in r.choices)
    assert r.usage.completion_tokens <= 16
    again = client.completions.create(model=model_name, prompt=["Once upon a time", "1, 2, 3,"],
                                      n=2, max_tokens=4, temperature=1.0, seed=11)  # fmt: skip
    assert [c.text for c in again.choices] == [c.text for c in r.choices]  # seeded


def test_streamed_n2_chat_finishes_every_choice(client, model_name):
    stream = client.chat.completions.create(model=model_name, messages=CHAT, n=2, max_tokens=4,
                                            temperature=1.0, seed=3, stream=True)  # fmt: skip
    texts, finished = {0: "", 1: ""}, set()
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1} and all(texts.values())


def test_completion_logprobs(client, model_name, greedy):
    r = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=4, temperature=0,
                                  logprobs=2)  # fmt: skip
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == r.choices[0].text and greedy.choices[0].text.startswith(
        r.choices[0].text
    )
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert value <= 0 and 1 <= len(top) <= 3
        assert top[token] == value == max(top.values())  # greedy picks the most likely
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0


def test_chat_logprobs(client, model_name):
    r = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=3,
                                       temperature=0, logprobs=True, top_logprobs=3)  # fmt: skip
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 3
    for item in content:
        alternatives = [a.logprob for a in item.top_logprobs]
        assert len(alternatives) == 3 and alternatives == sorted(alternatives, reverse=True)
        assert item.token == item.top_logprobs[0].token and item.logprob == alternatives[0]


def test_echo_and_stop_string(client, model_name, greedy):
    r = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=2, temperature=0,
                                  echo=True)  # fmt: skip
    assert r.choices[0].text.startswith(PROMPT)
    words = greedy.choices[0].text.split()
    stop = words[len(words) // 2]
    r = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=12,
                                  temperature=0, stop=[stop])  # fmt: skip
    full = greedy.choices[0].text
    assert r.choices[0].finish_reason == "stop" and stop not in r.choices[0].text
    assert r.choices[0].text == full[: full.index(stop)]

"""`inferd serve` on a tiny random LLaVA written by the test (the core in its own process): the
`openai` client sends an image in a chat message and streams the answer, the `anthropic` client
likewise with an image block; both answers are HF transformers' greedy tokens for the same
prompt and pixels."""

from __future__ import annotations

import base64
import io

import pytest
from server_helpers import ServerProcess
from tiny_vision_models import hf_greedy_with_images, hf_pixels, make_tiny_llava, random_images

from inferd.tokenizer import Tokenizer

MAX_TOKENS = 6


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llava-serve")
    hf = make_tiny_llava(folder)
    server = ServerProcess(str(folder), "--dtype", "float32", "--kv-cache-memory", "16MiB")
    try:
        server.wait_ready()
        yield server, folder, hf
    finally:
        server.stop()


def _expected(folder, hf, image) -> tuple[str, str]:
    """HF's greedy answer to the chat prompt the server renders (text, then the image):
    MAX_TOKENS tokens, and the tokens before the first EOS (Anthropic's API has no
    ignore_eos)."""
    tok = Tokenizer.from_hf_dir(folder)
    content = [{"type": "text", "text": "What is this?"}, {"type": "image"}]
    _, ids = tok.chat_prompt([{"role": "user", "content": content}])
    image_id = tok.encode("<image>", add_special_tokens=False)
    assert len(image_id) == 1 and ids.count(image_id[0]) == 1
    at = ids.index(image_id[0])
    ids = ids[:at] + image_id * 16 + ids[at + 1 :]
    _, tokens = hf_greedy_with_images(hf, ids, hf_pixels(folder, [image]), MAX_TOKENS)
    until_eos = tokens[: tokens.index(2)] if 2 in tokens else tokens
    return tok.decode(tokens), tok.decode(until_eos)


def test_openai_and_anthropic_clients_stream_an_answer_about_an_image(served):
    import anthropic
    from openai import OpenAI

    server, folder, hf = served
    image = random_images(1, seed=5)[0]
    png = io.BytesIO()
    image.save(png, format="PNG")
    b64 = base64.b64encode(png.getvalue()).decode()
    expected, until_eos = _expected(folder, hf, image)
    assert until_eos  # some text before any EOS: the comparisons below can fail

    client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    url = f"data:image/png;base64,{b64}"
    content = [{"type": "text", "text": "What is this?"},
               {"type": "image_url", "image_url": {"url": url}}]  # fmt: skip
    stream = client.chat.completions.create(
        model=str(folder), messages=[{"role": "user", "content": content}], stream=True,
        max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected

    sdk = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, block]}]
    with sdk.messages.stream(model=str(folder), max_tokens=MAX_TOKENS, messages=messages,
                             extra_body={"temperature": 0}) as s:  # fmt: skip
        text = "".join(s.text_stream)
    assert text == until_eos

"""Images through the whole engine on a tiny random LLaVA written by the test: LLM.generate
with PIL images or bytes matches HF transformers' greedy tokens in float32; the encoder cache
encodes an image once; the prefix cache reuses an image's blocks for the same image and never
for another; and in the default mode a request's tokens are the same alone and in a batch."""

from __future__ import annotations

import base64
import io

import pytest
from tiny_vision_models import hf_greedy_with_images, hf_pixels, make_tiny_llava, random_images

from inferd import LLM, SamplingParams

PROMPT = "The quick <image> brown fox"
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llava")
    return folder, make_tiny_llava(folder)


def _png(image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _hf_ids(llm, prompt: str, images: int) -> list[int]:
    """The prompt as HF's processor gives it: each <image> expanded to the model's count."""
    vision = llm.engine.model_config.vision
    ids = llm.engine.tokenizer.encode(prompt)
    out = []
    for t in ids:
        out += [t] * (vision.tokens_per_image if t == vision.image_token_id else 1)
    assert out.count(vision.image_token_id) == images * vision.tokens_per_image
    return out


def test_generate_with_images_matches_hf_and_caches(tiny_llava):
    folder, hf = tiny_llava
    llm = LLM(str(folder), dtype="float32", kv_cache_memory=8 << 20, block_size=4,
              enable_prefix_caching=True)  # fmt: skip
    one, two = random_images(2)
    prompt2 = "The <image> quick <image> brown fox"
    outs = llm.generate([{"prompt": PROMPT, "multi_modal_data": {"image": one}},
                         {"prompt": prompt2, "multi_modal_data": {"image": [_png(one), two]}}],
                        GREEDY, use_tqdm=False)  # fmt: skip
    for out, prompt, pics in ((outs[0], PROMPT, [one]), (outs[1], prompt2, [one, two])):
        ids = _hf_ids(llm, prompt, len(pics))
        assert list(out.prompt_token_ids) == ids
        _, ref = hf_greedy_with_images(hf, ids, hf_pixels(folder, pics), 8)
        assert list(out.outputs[0].token_ids) == ref
    cache = llm.engine.runner.encoder_cache
    assert cache.encodes == 2  # `one` came twice (as PIL and as PNG bytes): encoded once

    # LLM.chat: an image part (a data: URL) where the template writes <image>
    url = "data:image/png;base64," + base64.b64encode(_png(two)).decode()
    content = [
        {"type": "text", "text": "The quick"},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    chat = llm.chat([{"role": "user", "content": content}], GREEDY, use_tqdm=False)[0]
    ids = list(chat.prompt_token_ids)
    assert ids.count(llm.engine.model_config.vision.image_token_id) == 16
    _, ref = hf_greedy_with_images(hf, ids, hf_pixels(folder, [two]), 8)
    assert list(chat.outputs[0].token_ids) == ref

    # The same image again: its blocks come from the prefix cache; another image: none of
    # the blocks from where the image starts.
    again = llm.generate([{"prompt": PROMPT, "multi_modal_data": {"image": one}}], GREEDY,
                         use_tqdm=False)[0]  # fmt: skip
    other = llm.generate([{"prompt": PROMPT, "multi_modal_data": {"image": two}}], GREEDY,
                         use_tqdm=False)[0]  # fmt: skip
    image_start = _hf_ids(llm, PROMPT, 1).index(llm.engine.model_config.vision.image_token_id)
    assert again.num_cached_tokens >= len(again.prompt_token_ids) - 4
    assert other.num_cached_tokens <= image_start
    assert again.outputs[0].token_ids == outs[0].outputs[0].token_ids
    assert cache.encodes == 2  # `two` was encoded with the second prompt already


def test_default_mode_same_tokens_alone_and_in_a_batch(tiny_llava):
    folder, _ = tiny_llava
    llm = LLM(str(folder), kv_cache_memory=8 << 20, block_size=4, max_num_batched_tokens=24)
    one, two = random_images(2, seed=3)
    probe = {"prompt": PROMPT, "multi_modal_data": {"image": one}}
    alone = llm.generate([probe], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    batch = [
        {"prompt": "numbers 0123 <image> and", "multi_modal_data": {"image": two}},
        "The quick brown fox jumps",
        probe,
        {"prompt": "<image> lazy dog", "multi_modal_data": {"image": one}},
    ]
    outs = llm.generate(batch, GREEDY, use_tqdm=False)
    assert outs[2].outputs[0].token_ids == alone

"""Images in, without a model: decoding and its refusals, placeholder expansion and its
limits, block names with images, and the record's round trip over the core process's wire
format. (The pixels against HF's processor: tests/parity/test_vision_parity.py.)"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from inferd.block_hashes import prompt_block_hashes
from inferd.config import ModelConfig, VisionConfig
from inferd.engine.core.core_output import CoreRequest
from inferd.engine.frontend.input_processor import InputLimits, InputProcessor
from inferd.engine.transport import ipc
from inferd.errors import InvalidRequest
from inferd.multimodal.image_decode import decode_image
from inferd.multimodal.image_input import ImageInput, pixel_values
from inferd.multimodal.image_processor import ImagePreprocessor
from inferd.sampling_params import SamplingParams

IMAGE_TOKEN = 7
VISION = VisionConfig(kind="clip", hidden_size=8, intermediate_size=16, num_layers=1,
                      num_heads=2, image_size=16, patch_size=4, image_token_id=IMAGE_TOKEN,
                      tokens_per_image=16)  # fmt: skip


def _image(w: int = 24, h: int = 20, seed: int = 0):
    from PIL import Image

    rng = np.random.RandomState(seed)
    return Image.fromarray(rng.randint(0, 256, (h, w, 3), dtype=np.uint8))


def _bytes(image, fmt: str) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


@pytest.fixture
def preprocessor(tmp_path):
    # what CLIPImageProcessorPil(size={"shortest_edge": 16}, crop_size=16) saves
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({
        "do_resize": True, "size": {"shortest_edge": 16}, "resample": 3,
        "do_center_crop": True, "crop_size": {"height": 16, "width": 16},
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711]}))  # fmt: skip
    config = ModelConfig("llava", 32, 8, 16, 1, 2, 2, 4, vision=VISION)
    return ImagePreprocessor.from_folder(config, tmp_path, max_images=2), tmp_path


def test_refusals_name_what_was_wrong(preprocessor, monkeypatch):
    from PIL import Image

    pre, _ = preprocessor
    with pytest.raises(InvalidRequest, match="cannot be decoded"):
        decode_image(b"\x89PNG not really", "image")
    with pytest.raises(InvalidRequest, match="unsupported image format TIFF"):
        decode_image(_bytes(_image(), "TIFF"), "image")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(InvalidRequest, match=r"too large \(12x9 = 108 pixels\)") as e:
        decode_image(_bytes(_image(12, 9), "PNG"), "messages[0].content[1]")
    assert e.value.param == "messages[0].content[1]"
    with pytest.raises(InvalidRequest, match="too large.*limit of 100 pixels"):  # Pillow's own
        decode_image(_bytes(_image(), "PNG"), "image")
    monkeypatch.undo()
    with pytest.raises(InvalidRequest, match=r"at most 2 \(--limit-mm-per-prompt\)"):
        pre.expand([1, IMAGE_TOKEN] * 3, [_image()] * 3, "image")
    with pytest.raises(InvalidRequest, match="2 image placeholders and 1 images"):
        pre.expand([1, IMAGE_TOKEN, 5, IMAGE_TOKEN], [_image()], "image")


def test_placeholders_expand_and_name_their_blocks(preprocessor):
    pre, _ = preprocessor
    prompt = [1, 2, 3, 4, 5, IMAGE_TOKEN, 3]
    ids, images = pre.expand(prompt, [_bytes(_image(), "PNG")], "image")
    assert ids == [1, 2, 3, 4, 5] + [IMAGE_TOKEN] * 16 + [3]
    assert (images[0].offset, images[0].length) == (5, 16)
    _, same = pre.expand(prompt, [_image()], "image")  # PIL: the same pixels
    _, other = pre.expand(prompt, [_image(seed=1)], "image")
    assert same[0].content_hash == images[0].content_hash != other[0].content_hash
    a = prompt_block_hashes(ids, 4, b"root", images=images)
    b = prompt_block_hashes(ids, 4, b"root", images=same)
    c = prompt_block_hashes(ids, 4, b"root", images=other)
    plain = prompt_block_hashes(ids, 4, b"root")
    assert a == b
    assert a[0] == c[0] == plain[0]  # tokens 0-3: before the image
    assert all(x != y for x, y in zip(a[1:], c[1:], strict=True))  # from its block on: none
    assert all(x != y for x, y in zip(a[1:], plain[1:], strict=True))


def test_a_text_only_model_refuses_images():
    inputs = InputProcessor(None, InputLimits(vocab_size=32, max_model_len=64))
    prompt = {"prompt_token_ids": [1, 2, 3], "multi_modal_data": {"image": _image()}}
    with pytest.raises(InvalidRequest, match="reads text only") as e:
        inputs.make_request("r", prompt, SamplingParams(max_tokens=1))
    assert e.value.param == "multi_modal_data.image"


def test_images_cross_the_process_boundary(preprocessor):
    pre, _ = preprocessor
    ids, images = pre.expand([1, IMAGE_TOKEN, 3], [_image()], "image")
    request = CoreRequest("r", ids, SamplingParams(max_tokens=1), 1, 0.0, images=images)
    back = ipc.decode_to_core(ipc.encode(ipc.Add(request))).request
    assert back.images == images
    assert torch.equal(pixel_values(back.images[0]), pixel_values(images[0]))


def test_truncation_moves_the_images_or_refuses_to_cut_one():
    from inferd.multimodal.image_processor import shifted

    image = ImageInput(offset=5, length=16, content_hash=b"h", pixels=b"", height=0, width=0)
    assert shifted([image], 3)[0].offset == 2
    with pytest.raises(InvalidRequest, match="would cut an image") as e:
        shifted([image], 6)
    assert e.value.param == "truncate_prompt_tokens"

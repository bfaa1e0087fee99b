"""Parity with HF transformers on a tiny random LLaVA checkpoint written by the test: prompt
logits in float32 and greedy tokens with one and with two images, the image features put at
their placeholder tokens (SequenceStep.embeds), the prompt prefilled in chunks that cut through
an image (LLaVA's text model attends causally over image tokens, so a cut is exact)."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_vision_models import hf_greedy_with_images, hf_pixels, make_tiny_llava, random_images

from inferd.engine.execution.runner import ModelRunner, SequenceStep
from inferd.loader import load_model, open_checkpoint
from inferd.multimodal.image_input import pixel_values
from inferd.multimodal.image_processor import ImagePreprocessor


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llava")
    hf = make_tiny_llava(folder)
    model = load_model(open_checkpoint(folder), torch.float32, torch.device("cpu"))
    return folder, hf, model


def _prompt(image_token: int, tokens_per_image: int, images: int) -> list[int]:
    text = [[17, 250, 33], [98, 5, 77, 120], [200, 41]]
    out = [1]
    for i in range(images):
        out += text[i] + [image_token] * tokens_per_image
    return out + text[-1]


def _runs(prompt: list[int], image_token: int) -> list[tuple[int, int]]:
    """(start, length) of each run of placeholder tokens."""
    runs, i = [], 0
    while i < len(prompt):
        if prompt[i] == image_token:
            j = i
            while j < len(prompt) and prompt[j] == image_token:
                j += 1
            runs.append((i, j - i))
            i = j
        else:
            i += 1
    return runs


def inferd_greedy(model, prompt, features, n, chunk: int, block_size: int = 4):
    """Prefill in chunks of `chunk` tokens (each chunk given the image rows it covers), then
    greedy decode, with shuffled block tables."""
    image_token = model.config.vision.image_token_id
    runner = ModelRunner(model, [64], block_size, torch.float32, torch.device("cpu"))
    ids = list(range(1, 64))
    random.Random(0).shuffle(ids)
    tables = [ids[: (len(prompt) + n) // block_size + 1]]
    runs = list(zip(_runs(prompt, image_token), features))
    for start in range(0, len(prompt), chunk):
        end = min(start + chunk, len(prompt))
        embeds = []
        for (at, length), rows in runs:
            lo, hi = max(at, start), min(at + length, end)
            if lo < hi:
                embeds.append((lo - start, rows[lo - at : hi - at]))
        logits = runner.execute([SequenceStep(prompt[start:end], start, tables,
                                              needs_logits=end == len(prompt),
                                              embeds=tuple(embeds))])  # fmt: skip
    first, seq, tokens = logits[0].clone(), list(prompt), []
    for _ in range(n):
        token = int(logits[0].argmax())
        tokens.append(token)
        seq.append(token)
        logits = runner.execute([SequenceStep([token], len(seq) - 1, tables)])
    return first, tokens


@pytest.mark.parametrize("images", [1, 2])
def test_llava_matches_hf(llava, images):
    folder, hf, model = llava
    vision = model.config.vision
    pics = random_images(images)
    pixels = hf_pixels(folder, pics)
    prompt = _prompt(vision.image_token_id, vision.tokens_per_image, images)
    ref_logits, ref_tokens = hf_greedy_with_images(hf, prompt, pixels, 16)
    with torch.no_grad():
        features = model.encode_images(pixels)
    assert features.shape == (images, vision.tokens_per_image, model.config.hidden_size)
    for chunk in (len(prompt), 7):  # whole, then chunks cutting through every image
        logits, tokens = inferd_greedy(model, prompt, list(features), 16, chunk)
        torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
        assert tokens == ref_tokens


def test_images_change_the_answer(llava):
    # The parity above must see the images used: other pixels, other logits.
    folder, _, model = llava
    vision = model.config.vision
    prompt = _prompt(vision.image_token_id, vision.tokens_per_image, 1)
    with torch.no_grad():
        a = model.encode_images(hf_pixels(folder, random_images(1, seed=0)))
        b = model.encode_images(hf_pixels(folder, random_images(1, seed=1)))
    la, _ = inferd_greedy(model, prompt, list(a), 0, len(prompt))
    lb, _ = inferd_greedy(model, prompt, list(b), 0, len(prompt))
    assert not torch.allclose(la, lb, atol=1e-3)


def test_preprocessing_matches_hfs_pil_processor(llava):
    # inferd's own resize, crop (front end) and normalisation (core) against HF's pixels
    folder, _, model = llava
    pre = ImagePreprocessor.from_folder(model.config, folder)
    pics = random_images(4)  # wide, tall, square, larger
    ours = torch.stack([pixel_values(pre.prepare(p, "image", 0)) for p in pics])
    assert torch.equal(ours, hf_pixels(folder, pics))


def test_gemma3_image_features_match_hf(tmp_path):
    # Gemma 3's image side alone (the family is not registered yet: docs/vision.md): SigLIP
    # with its final norm, the avg-pool projector; and the SigLIP processor's pixels.
    import transformers
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    from inferd.config import ModelConfig, VisionConfig
    from inferd.models.gemma3_vision import Gemma3Projector
    from inferd.models.vision_encoder import VisionEncoder

    vc = transformers.SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        image_size=16, patch_size=2,
    )  # fmt: skip
    tc = transformers.Gemma3TextConfig(vocab_size=64, hidden_size=48, intermediate_size=96,
                                       num_hidden_layers=1, num_attention_heads=2,
                                       num_key_value_heads=1, head_dim=16)  # fmt: skip
    config = transformers.Gemma3Config(vision_config=vc, text_config=tc, mm_tokens_per_image=16,
                                       image_token_index=60)  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or "bias" in name or "projection" in name:
                p.add_(torch.randn_like(p) * 0.2)
    vision = VisionConfig(kind="siglip", hidden_size=32, intermediate_size=64, num_layers=2,
                          num_heads=4, image_size=16, patch_size=2, image_token_id=60,
                          tokens_per_image=16, layer_norm_eps=vc.layer_norm_eps,
                          hidden_act=vc.hidden_act, post_norm=True)  # fmt: skip
    tower, projector = VisionEncoder(vision), Gemma3Projector(vision, 48)
    state = hf.state_dict()
    for module, prefix in (
        (tower, "model.vision_tower."),
        (projector, "model.multi_modal_projector."),
    ):
        module.load_state_dict({k[len(prefix) :]: v for k, v in state.items()
                                if k.startswith(prefix) and ".head." not in k})  # fmt: skip

    SiglipImageProcessorPil(size={"height": 16, "width": 16}).save_pretrained(tmp_path)
    pics = random_images(3)
    ref_pixels = SiglipImageProcessorPil.from_pretrained(tmp_path)(images=pics, return_tensors="pt")
    pre = ImagePreprocessor.from_folder(ModelConfig("gemma3", 64, 48, 96, 1, 2, 1, 16,
                                                    vision=vision), tmp_path)  # fmt: skip
    pixels = torch.stack([pixel_values(pre.prepare(p, "image", 0)) for p in pics])
    assert torch.equal(pixels, ref_pixels["pixel_values"])
    with torch.no_grad():
        ref = hf.model.get_image_features(pixel_values=pixels).pooler_output
        ours = projector(tower(pixels))
    assert ours.shape == (3, 16, 48)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("text", ["mistral", "qwen2"])
def test_llava_with_other_text_models_matches_hf(tmp_path, text):
    # Mistral's window (12, shorter than the prompt) and Qwen2's q/k/v biases, read from
    # text_config by their own records
    hf = make_tiny_llava(tmp_path, text=text)
    model = load_model(open_checkpoint(tmp_path), torch.float32, torch.device("cpu"))
    vision = model.config.vision
    prompt = _prompt(vision.image_token_id, vision.tokens_per_image, 1)
    if text == "mistral":  # the window must bite, or the parity proves nothing about it
        assert model.config.layer_window(0) == 12 < len(prompt)
    pixels = hf_pixels(tmp_path, random_images(1))
    ref_logits, ref_tokens = hf_greedy_with_images(hf, prompt, pixels, 8)
    with torch.no_grad():
        features = model.encode_images(pixels)
    logits, tokens = inferd_greedy(model, prompt, list(features), 8, 7)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    assert tokens == ref_tokens

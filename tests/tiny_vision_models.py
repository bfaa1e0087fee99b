"""Tiny random vision-language checkpoints written by the tests (tiny_models.py's tokenizer with
an `<image>` special token, a few-layer vision tower, a few-layer text model), their images and
HF's reference inputs.

NOTE: no torchvision here. transformers 5's default image processors (`CLIPImageProcessor`, the
"fast" ones) need torchvision, whose newest release requires a newer torch than the pinned CPU
build; these helpers use the PIL-based processors (`CLIPImageProcessorPil`,
`SiglipImageProcessorPil`), which compute the same pixels without it. Do not install
torchvision to run these tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tiny_models import train_tokenizer

IMAGE_TOKEN = "<image>"
# A chat template that walks content parts and writes <image> for an image part, as the
# llava-hf checkpoints' templates do (tiny_models' own template takes strings only).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<image>{% else %}{{ p['text'] }}{% endif %}{% endfor %}"
    "{% endif %}</s>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
IMAGE_SIZE, PATCH = 16, 4  # 16 patches: 16 placeholder tokens per LLaVA image


def _tokenizer_with_image_token(folder: Path) -> int:
    """tiny_models' BPE plus `<image>` as a special token; returns its id."""
    from tokenizers import Tokenizer

    train_tokenizer(folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_special_tokens([IMAGE_TOKEN])
    tok.save(str(folder / "tokenizer.json"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = CHAT_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return tok.token_to_id(IMAGE_TOKEN)


def make_tiny_llava(folder: Path, seed: int = 0, text: str = "llama"):
    """A tiny random LlavaForConditionalGeneration (float32, eval) saved in `folder`, with its
    tokenizer and a PIL-based image processor config; returns the HF model. `text`: the text
    model's family (llama, mistral: a sliding window shorter than the prompts, qwen2)."""
    import transformers
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    folder.mkdir(parents=True, exist_ok=True)
    image_token = _tokenizer_with_image_token(folder)
    vision = transformers.CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        image_size=IMAGE_SIZE, patch_size=PATCH, projection_dim=32,
    )  # fmt: skip
    text_class, extra = {"llama": ("LlamaConfig", {}),
                         "mistral": ("MistralConfig", {"sliding_window": 12}),
                         "qwen2": ("Qwen2Config", {})}[text]  # fmt: skip
    text_config = getattr(transformers, text_class)(
        vocab_size=image_token + 8, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=1, eos_token_id=2, pad_token_id=3, initializer_range=0.1, **extra,
    )  # fmt: skip
    config = transformers.LlavaConfig(vision_config=vision, text_config=text_config,
                                      image_token_index=image_token)  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.LlavaForConditionalGeneration(config).to(torch.float32).eval()
    with torch.no_grad():  # norms and biases start at 1 / 0: randomise them so they count
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias") or "class_embedding" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3})
    )
    CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    ).save_pretrained(folder)
    return model


def random_images(count: int, seed: int = 0) -> list:
    """`count` random RGB PIL images of different sizes and aspect ratios."""
    from PIL import Image

    rng = np.random.RandomState(seed)
    sizes = [(20, 28), (31, 17), (16, 16), (40, 24)]
    return [Image.fromarray(rng.randint(0, 256, (*sizes[i % 4], 3), dtype=np.uint8))
            for i in range(count)]  # fmt: skip


def hf_pixels(folder: Path, images: list) -> torch.Tensor:
    """HF's pixel values for `images` from the folder's processor config (the PIL processor)."""
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    processor = CLIPImageProcessorPil.from_pretrained(folder)
    return processor(images=images, return_tensors="pt")["pixel_values"]


def hf_greedy_with_images(model, prompt: list[int], pixels: torch.Tensor | None, n: int):
    """(last-position float32 logits of the prompt, n greedy tokens) with HF's KV cache."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), pixel_values=pixels, use_cache=True)
        first = out.logits[0, -1].float().clone()
        past, tokens = _cache_of(out), []
        token = int(out.logits[0, -1].argmax())
        for _ in range(n):
            tokens.append(token)
            out = model(input_ids=torch.tensor([[token]]), cache=past, use_cache=True)
            past = _cache_of(out)
            token = int(out.logits[0, -1].argmax())
    return first, tokens


def _cache_of(out):
    """The KV cache of an HF output (transformers 5 renames `past_key_values` to `cache`)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values

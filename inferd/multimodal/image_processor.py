"""A vision-language model's image preprocessing and prompt placeholders, in the front end.

`ImagePreprocessor` reads the checkpoint folder's `preprocessor_config.json` (what HF's image
processor reads): resize (the shortest edge to a length, keeping the aspect ratio, or to a fixed
size; Pillow's resampling filter), centre crop, rescale and normalisation. The resize and crop
run here on the uint8 image with Pillow, as HF's PIL processors do; the rescale and
normalisation are the core's (image_input.py `pixel_values`).

Placeholders: the prompt holds one `image_token_id` per image (the model's chat template or the
caller writes it, `<image>` for LLaVA); each becomes `tokens_per_image` placeholders, the rows
the encoder's output fills (HF's processors expand it the same way). A prompt given as token ids
may hold them expanded already.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from inferd.config import ModelConfig, VisionConfig
from inferd.errors import InvalidRequest, ModelLoadError
from inferd.multimodal.image_decode import decode_image
from inferd.multimodal.image_input import ImageInput, content_hash

CONFIG_FILE = "preprocessor_config.json"
# OpenAI CLIP's normalisation: HF's CLIP processor's defaults
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class ImagePreprocessor:
    vision: VisionConfig
    shortest_edge: int | None  # resize the shortest edge to this, or to `resize` exactly
    resize: tuple[int, int] | None  # (height, width)
    crop: tuple[int, int] | None  # (height, width) of the centre crop; None: no crop
    resample: int  # Pillow's filter number (3: bicubic)
    rescale: float
    mean: tuple[float, ...]
    std: tuple[float, ...]
    max_images: int = 1  # per prompt (--limit-mm-per-prompt)

    @classmethod
    def from_folder(cls, config: ModelConfig, folder: Path, max_images: int = 1):
        vision = config.vision
        assert vision is not None
        path = folder / CONFIG_FILE
        try:
            cfg = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{path}: a vision-language checkpoint needs its image "
                                 f"processor's config ({e})") from e  # fmt: skip
        size = cfg.get("size") or {}
        shortest = size.get("shortest_edge") if cfg.get("do_resize", True) else None
        resize = None
        if shortest is None and cfg.get("do_resize", True):
            if "height" not in size or "width" not in size:
                raise ModelLoadError(f"{path}: size must have shortest_edge or height and width")
            resize = (int(size["height"]), int(size["width"]))
        crop = None
        if cfg.get("do_center_crop", False):
            c = cfg.get("crop_size") or {}
            crop = (int(c["height"]), int(c["width"])) if "height" in c else (int(c), int(c))
        out = crop or resize or (shortest, shortest)
        if out != (vision.image_size, vision.image_size):
            raise ModelLoadError(f"{path}: images come out {out[0]}x{out[1]}, the encoder takes "
                                 f"{vision.image_size}x{vision.image_size}")  # fmt: skip
        normalize = cfg.get("do_normalize", True)
        return cls(
            vision=vision,
            shortest_edge=None if shortest is None else int(shortest),
            resize=resize,
            crop=crop,
            resample=int(cfg.get("resample", 3)),
            rescale=float(cfg.get("rescale_factor", 1 / 255)) if cfg.get("do_rescale", True)
            else 1.0,
            mean=tuple(cfg.get("image_mean", _CLIP_MEAN)) if normalize else (0.0,) * 3,
            std=tuple(cfg.get("image_std", _CLIP_STD)) if normalize else (1.0,) * 3,
            max_images=max_images,
        )  # fmt: skip

    def prepare(self, data, param: str, offset: int) -> ImageInput:
        """One image (bytes or PIL) → its record, placed at prompt index `offset`."""
        image = decode_image(data, param)
        w, h = image.size
        if self.shortest_edge is not None:
            short = self.shortest_edge
            # HF's rule (get_resize_output_image_size): the long edge truncated
            h, w = (int(short * h / w), short) if w <= h else (short, int(short * w / h))
            image = image.resize((w, h), self.resample)
        elif self.resize is not None:
            h, w = self.resize
            image = image.resize((w, h), self.resample)
        raw = np.asarray(image, dtype=np.uint8)
        if self.crop is not None:
            ch, cw = self.crop
            if ch > h or cw > w:
                raise InvalidRequest(param, f"the image is {w}x{h} after resizing, smaller "
                                     f"than the {cw}x{ch} crop")  # fmt: skip
            top, left = (h - ch) // 2, (w - cw) // 2
            raw = raw[top : top + ch, left : left + cw]
        pixels = np.ascontiguousarray(raw).tobytes()
        height, width = raw.shape[:2]
        digest = content_hash(pixels, height, width, self.rescale, self.mean, self.std)
        return ImageInput(offset, self.vision.tokens_per_image, digest, pixels, height, width,
                          self.rescale, self.mean, self.std)  # fmt: skip

    def expand(
        self, ids: list[int], images: list, param: str
    ) -> tuple[list[int], list[ImageInput]]:
        """(prompt ids with each image's placeholders expanded, the images' records)."""
        if len(images) > self.max_images:
            raise InvalidRequest(param, f"{len(images)} images in one prompt; this server takes "
                                 f"at most {self.max_images} (--limit-mm-per-prompt)")  # fmt: skip
        token, per = self.vision.image_token_id, self.vision.tokens_per_image
        runs = _runs(ids, token)
        if len(runs) != len(images):
            raise InvalidRequest(param, f"the prompt has {len(runs)} image placeholders and "
                                 f"{len(images)} images were given: one placeholder per "
                                 "image")  # fmt: skip
        out: list[int] = []
        records: list[ImageInput] = []
        last = 0
        for i, ((start, length), data) in enumerate(zip(runs, images, strict=True)):
            if length not in (1, per):
                raise InvalidRequest(param, f"image {i}'s placeholder run has {length} tokens: "
                                     f"1 or the model's {per}")  # fmt: skip
            out.extend(ids[last:start])
            records.append(self.prepare(data, f"{param}[{i}]", len(out)))
            out.extend([token] * per)
            last = start + length
        out.extend(ids[last:])
        return out, records


def shifted(images: list[ImageInput], dropped: int) -> list[ImageInput]:
    """The images of a prompt whose first `dropped` tokens were cut (truncate_prompt_tokens),
    their offsets moved; an image the cut reaches is refused, not silently half-kept."""
    if any(i.offset < dropped for i in images):
        message = (f"truncating the prompt to its last tokens would cut an image's "
                   f"placeholders (its first {dropped} tokens go)")  # fmt: skip
        raise InvalidRequest("truncate_prompt_tokens", message)
    return [replace(i, offset=i.offset - dropped) for i in images]


def _runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    """(start, length) of each run of `token` in `ids`."""
    runs, i = [], 0
    while i < len(ids):
        if ids[i] != token:
            i += 1
            continue
        j = i
        while j < len(ids) and ids[j] == token:
            j += 1
        runs.append((i, j - i))
        i = j
    return runs


def image_preprocessor(config: ModelConfig, engine) -> ImagePreprocessor | None:
    """The model's preprocessor (None for a text-only model); `engine`: the EngineConfig (its
    `model`, the checkpoint's path: an HF folder or a file in it, and its limits)."""
    if config.vision is None or engine.model is None:
        return None
    if engine.tensor_parallel_size > 1:
        raise ModelLoadError("vision-language models do not run with tensor parallelism yet "
                             "(--tensor-parallel-size 1)")  # fmt: skip
    path = Path(engine.model).expanduser()
    return ImagePreprocessor.from_folder(config, path if path.is_dir() else path.parent,
                                         engine.limit_mm_per_prompt)  # fmt: skip

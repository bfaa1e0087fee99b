"""An image as it travels from the front end to the engine core, and the core's last step
before the encoder.

The front end resizes and crops an image to the encoder's size (image_processor.py) and sends
its pixels as bytes, uint8 RGB: 3 bytes a pixel, 1/4 of the float32 pixel values and far less
than the encoder's output (LLaVA-1.5: 576 rows of 4096 floats, 9.4 MB, against 338 KB of
pixels; docs/vision.md has the measurement). The rescale and normalisation, cheap, happen in the
core (`pixel_values`), as HF's processors compute them.

The content hash names the image's pixels as the encoder sees them (and the normalisation):
the encoder cache's key, and what the prefix cache mixes into the names of the blocks that hold
the image's tokens (inferd/block_hashes.py), so two different images never share blocks.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class ImageInput:
    offset: int  # the prompt index of its first placeholder token
    length: int  # its placeholder tokens: the rows its encoding puts there
    content_hash: bytes  # sha256 of its pixels, size and normalisation
    pixels: bytes  # uint8 RGB, height x width x 3, at the encoder's size
    height: int
    width: int
    rescale: float = 1 / 255
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)


def content_hash(pixels: bytes, height: int, width: int, rescale: float,
                 mean: tuple[float, ...], std: tuple[float, ...]) -> bytes:  # fmt: skip
    h = hashlib.sha256(f"{height}x{width}|{rescale!r}|{mean!r}|{std!r}|".encode())
    h.update(pixels)
    return h.digest()


def pixel_values(image: ImageInput) -> torch.Tensor:
    """The encoder's input [3, height, width] float32, as HF's image processors compute it:
    the uint8 values times `rescale` in float64, rounded to float32, minus the mean, over the
    std (numpy, float32)."""
    raw = np.frombuffer(image.pixels, dtype=np.uint8).reshape(image.height, image.width, 3)
    x = (raw.astype(np.float64) * image.rescale).astype(np.float32)
    mean = np.asarray(image.mean, dtype=np.float32)
    std = np.asarray(image.std, dtype=np.float32)
    x = (x - mean) / std
    return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))

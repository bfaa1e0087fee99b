"""What the engine asks of a model with an image side, mixed into a family's class (LLaVA:
models/llava.py): encode preprocessed images into rows of the text model's embedding width,
and skip the checkpoint tensors its features do not use."""

from __future__ import annotations

import torch
from torch import nn

from inferd.models.vision_encoder import VisionEncoder


class VisionLanguageModel:
    """Needs `vision_tower`, `multi_modal_projector` and `vision_dtype` set by the family."""

    vision_tower: VisionEncoder
    multi_modal_projector: nn.Module

    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """Preprocessed images [images, channels, size, size] → float32 embeddings
        [images, tokens_per_image, hidden], one row per placeholder token."""
        features = self.vision_tower(pixels.to(self.vision_dtype))
        return self.multi_modal_projector(features).float()

    def skips_tensor(self, name: str) -> bool:
        prefix = "vision_tower."
        return name.startswith(prefix) and self.vision_tower.unused_tensor(name[len(prefix) :])

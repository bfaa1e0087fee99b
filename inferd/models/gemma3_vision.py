"""Gemma 3's image side (HF `Gemma3ForConditionalGeneration`): a SigLIP vision tower
(models/vision_encoder.py, its final norm applied) and Gemma 3's projector: the patch grid
average-pooled down to `tokens_per_image` cells, an RMSNorm with Gemma's (1 + w) gain, one
matrix to the text model's width.

Not registered as a family yet (issue 58): HF lets an image's tokens attend to each other in
both directions inside the text decoder (its `token_type_ids` mask), which inferd's attention
backends and chunked prefill do not do yet; until they do, a Gemma 3 vision checkpoint is
refused by the loader ("unsupported architecture") rather than answered subtly wrong.
"""

from __future__ import annotations

import torch
from torch import nn

from inferd.config import VisionConfig


class Gemma3Projector(nn.Module):
    """HF's `multi_modal_projector` (names map one to one)."""

    def __init__(self, vision: VisionConfig, text_hidden: int):
        super().__init__()
        side = vision.image_size // vision.patch_size
        cells = round(vision.tokens_per_image**0.5)
        if cells * cells != vision.tokens_per_image or side % cells:
            raise ValueError(f"mm_tokens_per_image {vision.tokens_per_image} must be a square "
                             f"whose side divides the {side}x{side} patch grid")  # fmt: skip
        self.side, self.kernel, self.eps = side, side // cells, vision.layer_norm_eps
        self.mm_input_projection_weight = nn.Parameter(torch.empty(vision.hidden_size, text_hidden))
        self.mm_soft_emb_norm = _GainOnly(vision.hidden_size)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """[images, patches, vision hidden] → [images, tokens_per_image, text hidden]."""
        b, _, d = features.shape
        grid = features.transpose(1, 2).reshape(b, d, self.side, self.side)
        pooled = nn.functional.avg_pool2d(grid, self.kernel, self.kernel).flatten(2).transpose(1, 2)
        x = pooled.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = (x * (1.0 + self.mm_soft_emb_norm.weight.float())).to(features.dtype)
        return torch.matmul(x, self.mm_input_projection_weight)


class _GainOnly(nn.Module):
    """Holds HF's `mm_soft_emb_norm.weight` (the norm is computed in `Gemma3Projector`)."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))

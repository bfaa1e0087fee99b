"""The vision transformer of a vision-language model: an image cut into square patches, each
patch a token, a stack of bidirectional pre-norm transformer layers over them. Two kinds share
the layer: CLIP (LLaVA: a class token and a norm before the layers) and SigLIP (Gemma 3: no
class token, biased patch projection, a norm after the layers).

Module and parameter names follow HF's `CLIPVisionTransformer` / `SiglipVisionTransformer`, so a
checkpoint's tensors load by name (the family's record maps the checkpoint's prefixes to
`vision_tower.`). The encoder is small next to the text model and runs once per image, so it
computes with plain PyTorch layers in the model's dense dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inferd.config import VisionConfig


def activation(name: str):
    """HF's ACT2FN entries the vision towers and projectors use."""
    if name == "quick_gelu":
        return lambda x: x * torch.sigmoid(1.702 * x)
    if name in ("gelu_pytorch_tanh", "gelu_new", "gelu_fast"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu
    if name == "silu":
        return F.silu
    raise ValueError(f"unsupported vision activation {name!r}")


class VisionEmbeddings(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.clip = cfg.kind == "clip"
        d = cfg.hidden_size
        self.patch_embedding = nn.Conv2d(cfg.num_channels, d, cfg.patch_size, cfg.patch_size,
                                         bias=not self.clip)  # fmt: skip
        if self.clip:
            self.class_embedding = nn.Parameter(torch.empty(d))
        self.position_embedding = nn.Embedding(cfg.num_patches + self.clip, d)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype))
        x = x.flatten(2).transpose(1, 2)  # [images, patches, hidden], row-major patch order
        if self.clip:
            cls = self.class_embedding.expand(x.shape[0], 1, -1)
            x = torch.cat([cls, x], dim=1)
        return x + self.position_embedding.weight[None]


class VisionAttention(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        d = cfg.hidden_size
        if d % cfg.num_heads:
            raise ValueError(
                f"vision hidden_size {d} is not a multiple of its {cfg.num_heads} heads"
            )
        self.heads = cfg.num_heads
        self.q_proj, self.k_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.v_proj, self.out_proj = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        out = F.scaled_dot_product_attention(q, k, v)  # every patch sees every patch
        return self.out_proj(out.transpose(1, 2).reshape(b, n, d))


class VisionMLP(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class VisionLayer(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.self_attn = VisionAttention(cfg)
        self.layer_norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = VisionMLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class VisionEncoderLayers(nn.Module):
    """HF's `encoder` submodule (names map one to one)."""

    def __init__(self, cfg: VisionConfig, count: int):
        super().__init__()
        self.layers = nn.ModuleList(VisionLayer(cfg) for _ in range(count))


class VisionEncoder(nn.Module):
    """pixels [images, channels, size, size] → features [images, tokens, hidden]: the hidden
    state the config's `feature_layer` names, the class token dropped where `feature_select`
    says so. Layers after the feature layer are not built (LLaVA reads the second to last):
    a checkpoint's tensors for them are skipped by `unused_tensor`."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.cfg = cfg
        self.depth = feature_depth(cfg)
        self.embeddings = VisionEmbeddings(cfg)
        if cfg.kind == "clip":
            # (HF's spelling)
            self.pre_layrnorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.encoder = VisionEncoderLayers(cfg, self.depth)
        if cfg.post_norm:
            self.post_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(pixels)
        if self.cfg.kind == "clip":
            x = self.pre_layrnorm(x)
        for layer in self.encoder.layers:
            x = layer(x)
        if self.cfg.post_norm:
            x = self.post_layernorm(x)
        if self.cfg.kind == "clip" and self.cfg.feature_select == "default":
            x = x[:, 1:]  # the class token summarises the image; LLaVA keeps only the patches
        return x

    def unused_tensor(self, name: str) -> bool:
        """Whether a checkpoint tensor (its name under `vision_tower.`) belongs to a part the
        features do not use: layers after the feature layer, an unused final norm, SigLIP's
        pooling head."""
        if name.startswith("encoder.layers."):
            return int(name.split(".")[2]) >= self.depth
        if name.startswith("post_layernorm."):
            return not self.cfg.post_norm
        return name.startswith("head.")


def feature_depth(cfg: VisionConfig) -> int:
    """Layers to run: HF's `hidden_states[feature_layer]` is the output of that many layers."""
    depth = cfg.feature_layer % (cfg.num_layers + 1)
    if not -(cfg.num_layers + 1) <= cfg.feature_layer <= cfg.num_layers:
        raise ValueError(f"vision_feature_layer {cfg.feature_layer} is outside the encoder's "
                         f"{cfg.num_layers} layers")  # fmt: skip
    return depth

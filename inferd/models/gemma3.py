"""Gemma 3 (text): sandwich norms around attention and MLP, (1 + w) RMSNorms, q/k norms,
GELU-tanh MLP, embeddings scaled by sqrt(hidden), and sliding-window layers with their own RoPE
base interleaved with full-attention layers (every 6th by default)."""

from __future__ import annotations

import torch
from torch import nn

from inferd.attention.backend import ForwardContext
from inferd.config import ModelConfig
from inferd.distributed.state import TPGroup
from inferd.layers.attention import SelfAttention
from inferd.layers.norm import RMSNorm
from inferd.models.base import CausalLM
from inferd.models.llama import GatedMLP


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, dtype: torch.dtype, tp: TPGroup):
        super().__init__()
        dim, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(dim, eps, True, dtype)
        self.self_attn = SelfAttention(config, layer, dtype, norm_offset=True, tp=tp)
        # The sandwich norms' outputs join the float32 residual stream (see CausalLM.forward).
        self.post_attention_layernorm = RMSNorm(dim, eps, True, dtype, out_dtype=torch.float32)
        self.pre_feedforward_layernorm = RMSNorm(dim, eps, True, dtype)
        self.mlp = GatedMLP(config, dtype, tp)
        self.post_feedforward_layernorm = RMSNorm(dim, eps, True, dtype, out_dtype=torch.float32)
        self.fused = None  # a FusedDecodeLayer in gguf mode (layers/fused_decode.py)

    def forward(self, h: torch.Tensor, rope, ctx: ForwardContext) -> torch.Tensor:
        if self.fused is not None and (out := self.fused(h, rope, ctx)) is not None:
            return out
        h = h + self.post_attention_layernorm(self.self_attn(self.input_layernorm(h), rope, ctx))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class Gemma3ForCausalLM(CausalLM):
    norm_offset = True

    def make_layer(self, config: ModelConfig, layer: int, dtype: torch.dtype, tp: TPGroup):
        return Gemma3DecoderLayer(config, layer, dtype, tp)

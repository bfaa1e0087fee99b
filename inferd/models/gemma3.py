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
from inferd.layers.norm import scheme_norm
from inferd.layers.weight_scheme import WeightScheme
from inferd.models.base import CausalLM, DecoderLayerParts
from inferd.models.llama import GatedMLP


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, scheme: WeightScheme, tp: TPGroup):
        super().__init__()
        dim, eps = config.hidden_size, config.rms_norm_eps
        self.activation = config.hidden_act
        self.input_layernorm = scheme_norm(scheme, dim, eps, True)
        self.self_attn = SelfAttention(config, layer, scheme, norm_offset=True, tp=tp)
        # The sandwich norms' outputs join the float32 residual stream (see CausalLM.forward).
        self.post_attention_layernorm = scheme_norm(scheme, dim, eps, True, residual=True)
        self.pre_feedforward_layernorm = scheme_norm(scheme, dim, eps, True)
        self.mlp = GatedMLP(config, scheme, tp)
        self.post_feedforward_layernorm = scheme_norm(scheme, dim, eps, True, residual=True)

    def forward(self, h: torch.Tensor, rope, ctx: ForwardContext) -> torch.Tensor:
        h = h + self.post_attention_layernorm(self.self_attn(self.input_layernorm(h), rope, ctx))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))

    def parts(self) -> DecoderLayerParts:
        return DecoderLayerParts(
            input_norm=self.input_layernorm, attention=self.self_attn,
            pre_mlp_norm=self.pre_feedforward_layernorm, mlp=self.mlp,
            activation=self.activation, post_attention_norm=self.post_attention_layernorm,
            post_mlp_norm=self.post_feedforward_layernorm,
        )  # fmt: skip


class Gemma3ForCausalLM(CausalLM):
    norm_offset = True

    def make_layer(self, config: ModelConfig, layer: int, scheme: WeightScheme, tp: TPGroup):
        return Gemma3DecoderLayer(config, layer, scheme, tp)

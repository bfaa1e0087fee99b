"""Llama (also Mistral, TinyLlama, Llama 3.x): pre-norm blocks, SiLU-gated MLP, RoPE.
Qwen2 and Qwen3 reuse it with q/k/v bias and per-head q/k norms respectively."""

from __future__ import annotations

import torch
from torch import nn

from inferd.attention.backend import ForwardContext
from inferd.config import ModelConfig
from inferd.distributed.state import SINGLE, TPGroup
from inferd.layers.activation import gated
from inferd.layers.attention import SelfAttention
from inferd.layers.linear import Linear
from inferd.layers.norm import RMSNorm
from inferd.models.base import CausalLM


class GatedMLP(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, tp: TPGroup = SINGLE):
        super().__init__()
        inter = config.intermediate_size
        i0, ni = tp.split(inter, "the MLP's intermediate size")
        self.gate_up_proj = Linear(config.hidden_size, [inter, inter], False, dtype,
                                   row_ranges=[(i0, ni), (i0, ni)], tp=tp)  # fmt: skip
        self.down_proj = Linear(inter, config.hidden_size, False, dtype,
                                col_range=(i0, ni) if tp.enabled else None, tp=tp)  # fmt: skip
        self.act = gated(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, dtype: torch.dtype, tp: TPGroup):
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, dtype=dtype)
        self.self_attn = SelfAttention(config, layer, dtype, norm_offset=False, tp=tp)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, dtype=dtype)
        self.mlp = GatedMLP(config, dtype, tp)
        self.fused = None  # a FusedDecodeLayer in gguf mode (layers/fused_decode.py)

    def forward(self, h: torch.Tensor, rope, ctx: ForwardContext) -> torch.Tensor:
        if self.fused is not None and (out := self.fused(h, rope, ctx)) is not None:
            return out
        h = h + self.self_attn(self.input_layernorm(h), rope, ctx)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaForCausalLM(CausalLM):
    def make_layer(self, config: ModelConfig, layer: int, dtype: torch.dtype, tp: TPGroup):
        return LlamaDecoderLayer(config, layer, dtype, tp)

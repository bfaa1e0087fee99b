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
from inferd.layers.norm import scheme_norm
from inferd.layers.weight_scheme import WeightScheme, as_scheme
from inferd.models.base import CausalLM, DecoderLayerParts


class GatedMLP(nn.Module):
    def __init__(self, config: ModelConfig, scheme: WeightScheme | torch.dtype,
                 tp: TPGroup = SINGLE):  # fmt: skip
        super().__init__()
        scheme = as_scheme(scheme)
        inter = config.intermediate_size
        i0, ni = tp.split(inter, "the MLP's intermediate size")
        self.gate_up_proj = Linear(config.hidden_size, [inter, inter], False, scheme,
                                   row_ranges=[(i0, ni), (i0, ni)], tp=tp)  # fmt: skip
        self.down_proj = Linear(inter, config.hidden_size, False, scheme,
                                col_range=(i0, ni) if tp.enabled else None, tp=tp)  # fmt: skip
        self.act = gated(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, scheme: WeightScheme, tp: TPGroup):
        super().__init__()
        dim, eps = config.hidden_size, config.rms_norm_eps
        self.activation = config.hidden_act
        self.input_layernorm = scheme_norm(scheme, dim, eps, False)
        self.self_attn = SelfAttention(config, layer, scheme, norm_offset=False, tp=tp)
        self.post_attention_layernorm = scheme_norm(scheme, dim, eps, False)
        self.mlp = GatedMLP(config, scheme, tp)

    def forward(self, h: torch.Tensor, rope, ctx: ForwardContext) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), rope, ctx)
        return h + self.mlp(self.post_attention_layernorm(h))

    def parts(self) -> DecoderLayerParts:
        # HF's "post_attention_layernorm" of Llama is the norm before the MLP.
        return DecoderLayerParts(input_norm=self.input_layernorm, attention=self.self_attn,
                                 pre_mlp_norm=self.post_attention_layernorm, mlp=self.mlp,
                                 activation=self.activation)  # fmt: skip


class LlamaForCausalLM(CausalLM):
    def make_layer(self, config: ModelConfig, layer: int, scheme: WeightScheme, tp: TPGroup):
        return LlamaDecoderLayer(config, layer, scheme, tp)

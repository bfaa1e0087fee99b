"""Llama (TinyLlama, SmolLM, Llama 3.x): pre-norm blocks, SiLU-gated MLP, RoPE. The layer is
shared by the families that compute the same way (Mistral, Phi-3, Qwen2/3) and, with a Mixture
of Experts in place of the MLP, by Qwen2-MoE, Qwen3-MoE and Mixtral (their model files)."""

from __future__ import annotations

import torch
from torch import nn

from inferd.attention.backend import ForwardContext
from inferd.config import ModelConfig
from inferd.distributed.state import SINGLE, TPGroup
from inferd.layers.activation import gated
from inferd.layers.attention import SelfAttention
from inferd.layers.linear import Linear
from inferd.layers.moe import SparseMoE
from inferd.layers.norm import scheme_norm
from inferd.layers.weight_scheme import WeightScheme, as_scheme
from inferd.models.architecture import Architecture
from inferd.models.base import CausalLM
from inferd.models.decoder_layer_parts import DecoderLayerParts


class GatedMLP(nn.Module):
    def __init__(self, config: ModelConfig, scheme: WeightScheme | torch.dtype,
                 tp: TPGroup = SINGLE, intermediate_size: int | None = None):  # fmt: skip
        """`intermediate_size`: the config's unless given (a shared expert's)."""
        super().__init__()
        scheme = as_scheme(scheme)
        inter = intermediate_size or config.intermediate_size
        i0, ni = tp.split(inter, "the MLP's intermediate size")
        self.gate_up_proj = Linear(config.hidden_size, [inter, inter], False, scheme,
                                   row_ranges=[(i0, ni), (i0, ni)], tp=tp)  # fmt: skip
        self.down_proj = Linear(inter, config.hidden_size, False, scheme,
                                col_range=(i0, ni) if tp.enabled else None, tp=tp)  # fmt: skip
        self.act = gated(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


def make_mlp(config: ModelConfig, layer: int, scheme: WeightScheme, tp: TPGroup) -> nn.Module:
    """The layer's MLP: a Mixture of Experts where the config says so, else the gated MLP."""
    if config.is_moe_layer(layer):
        shared = None
        if config.moe.shared_intermediate_size:
            shared = GatedMLP(config, scheme, tp, config.moe.shared_intermediate_size)
        return SparseMoE(config, scheme, tp, shared)
    return GatedMLP(config, scheme, tp)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, scheme: WeightScheme, tp: TPGroup):
        super().__init__()
        dim, eps = config.hidden_size, config.rms_norm_eps
        self.activation = config.hidden_act
        self.input_layernorm = scheme_norm(scheme, dim, eps, False)
        self.self_attn = self.make_attention(config, layer, scheme, tp)
        self.post_attention_layernorm = scheme_norm(scheme, dim, eps, False)
        self.mlp = make_mlp(config, layer, scheme, tp)

    def make_attention(self, config: ModelConfig, layer: int, scheme: WeightScheme,
                       tp: TPGroup) -> SelfAttention:  # fmt: skip
        return SelfAttention(config, layer, scheme, norm_offset=False, tp=tp)

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


# HF's Llama ignores a `sliding_window` key (Mistral's record reads it). llama.cpp's converter
# reorders Llama's q/k rows for its RoPE; Mistral GGUF files are "llama" files too.
ARCHITECTURE = Architecture(
    name="llama",
    model_class=LlamaForCausalLM,
    hf_classes=("LlamaForCausalLM",),
    gguf_names=("llama",),
    gguf_qk_permuted=True,
)

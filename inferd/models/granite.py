"""Granite 3 (dense): Llama's layer with four scalars from the config: embeddings multiplied by
`embedding_multiplier`, every attention and MLP output by `residual_multiplier` before it joins
the residual stream, queries scaled by `attention_multiplier` (in place of 1/sqrt(head_dim)),
and logits divided by `logits_scaling` (CausalLM.compute_logits)."""

from __future__ import annotations

import torch

from inferd.attention.backend import ForwardContext
from inferd.config import ModelConfig
from inferd.distributed.state import TPGroup
from inferd.layers.weight_scheme import WeightScheme
from inferd.models.architecture import Architecture
from inferd.models.decoder_layer_parts import DecoderLayerParts
from inferd.models.llama import LlamaDecoderLayer, LlamaForCausalLM


class GraniteDecoderLayer(LlamaDecoderLayer):
    def __init__(self, config: ModelConfig, layer: int, scheme: WeightScheme, tp: TPGroup):
        super().__init__(config, layer, scheme, tp)
        self.residual_multiplier = config.residual_multiplier

    def forward(self, h: torch.Tensor, rope, ctx: ForwardContext) -> torch.Tensor:
        # HF multiplies the branch's output (model dtype) before the add, as here
        m = self.residual_multiplier
        h = h + self.self_attn(self.input_layernorm(h), rope, ctx) * m
        return h + self.mlp(self.post_attention_layernorm(h)) * m

    def parts(self) -> DecoderLayerParts:
        return DecoderLayerParts(input_norm=self.input_layernorm, attention=self.self_attn,
                                 pre_mlp_norm=self.post_attention_layernorm, mlp=self.mlp,
                                 activation=self.activation,
                                 residual_multiplier=self.residual_multiplier)  # fmt: skip


class GraniteForCausalLM(LlamaForCausalLM):
    def make_layer(self, config: ModelConfig, layer: int, scheme: WeightScheme, tp: TPGroup):
        return GraniteDecoderLayer(config, layer, scheme, tp)


def _hf_fields(r) -> dict:
    """HF's defaults (1.0 each) where config.json lacks a multiplier."""
    return dict(
        embedding_multiplier=r.number("embedding_multiplier", 1.0),
        residual_multiplier=r.number("residual_multiplier", 1.0),
        query_scale=r.number("attention_multiplier", 1.0),
        logits_scaling=r.number("logits_scaling", 1.0),
    )


def _gguf_fields(g) -> dict:
    """llama.cpp's converter writes the multipliers as `*_scale` keys, each only when set; its
    loader's defaults where one is missing: 1, and 1/sqrt(head_dim) for the queries."""
    scale = g.meta("attention.scale", None)
    return dict(
        embedding_multiplier=float(g.meta("embedding_scale", 1.0)),
        residual_multiplier=float(g.meta("residual_scale", 1.0)),
        query_scale=float(scale) if scale else None,
        logits_scaling=float(g.meta("logit_scale", 1.0)),
    )


ARCHITECTURE = Architecture(
    name="granite",
    model_class=GraniteForCausalLM,
    hf_classes=("GraniteForCausalLM",),
    gguf_names=("granite",),
    hf_fields=_hf_fields,
    gguf_fields=_gguf_fields,
    gguf_qk_permuted=True,  # llama.cpp converts Granite as a Llama (q/k rows reordered)
    # Granite 3's own template calls tools as <|tool_call|>[{...}], which no inferd parser reads;
    # hermes is the JSON format nearest to it.
    tool_call_format="hermes",
)

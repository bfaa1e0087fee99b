"""Gemma 3 (text): sandwich norms around attention and MLP, (1 + w) RMSNorms, q/k norms,
GELU-tanh MLP, embeddings scaled by sqrt(hidden), and sliding-window layers with their own RoPE
base interleaved with full-attention layers (every 6th by default)."""

from __future__ import annotations

import torch
from torch import nn

from inferd.attention.backend import ForwardContext
from inferd.config import FULL_ATTENTION, SLIDING_ATTENTION, ModelConfig, RopeConfig
from inferd.distributed.state import TPGroup
from inferd.layers.attention import SelfAttention
from inferd.layers.norm import scheme_norm
from inferd.layers.weight_scheme import WeightScheme
from inferd.models.architecture import GGUF_TENSORS, Architecture
from inferd.models.base import CausalLM
from inferd.models.decoder_layer_parts import DecoderLayerParts
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


# Gemma 3 facts llama.cpp's converter does not store (see DESIGN.md): HF's defaults.
_LOCAL_ROPE_BASE = 10_000.0
_SLIDING_PATTERN = 6  # every 6th layer is full attention
_QUERY_PRE_ATTN_SCALAR = 256


def _pattern(n: int, every: int) -> tuple[str, ...]:
    return tuple(SLIDING_ATTENTION if (i + 1) % every else FULL_ATTENTION for i in range(n))


def _hf_fields(r) -> dict:
    """config.json: per-layer-type RoPE (transformers 5: rope_parameters keyed by layer type),
    the sliding pattern, the query scale, soft-capping; embeddings scaled by sqrt(hidden)."""
    params = r.cfg.get("rope_parameters")
    per_type = params if isinstance(params, dict) and FULL_ATTENTION in params else {}
    theta = r.number("rope_theta", None)
    return dict(
        rope=r.rope(per_type.get(FULL_ATTENTION), theta or 1_000_000.0, r.cfg.get("rope_scaling"),
                    f"rope_parameters.{FULL_ATTENTION}"),
        rope_local=r.rope(per_type.get(SLIDING_ATTENTION),
                          r.number("rope_local_base_freq", _LOCAL_ROPE_BASE), None,
                          f"rope_parameters.{SLIDING_ATTENTION}"),
        layer_types=_pattern(r.int("num_hidden_layers"), r.int("sliding_window_pattern", 6)),
        query_scale=r.number("query_pre_attn_scalar", 256.0) ** -0.5,
        embedding_multiplier=r.int("hidden_size") ** 0.5,
        qk_norm=True,
        tie_word_embeddings=r.bool("tie_word_embeddings", True),
        final_logit_softcapping=r.number("final_logit_softcapping", None),
        attn_logit_softcapping=r.number("attn_logit_softcapping", None),
    )  # fmt: skip


def _gguf_fields(g) -> dict:
    return dict(
        hidden_act="gelu_pytorch_tanh",
        layer_types=_pattern(g.num_layers, _SLIDING_PATTERN),
        sliding_window=int(g.meta("attention.sliding_window")),
        rope_local=RopeConfig(theta=_LOCAL_ROPE_BASE),
        query_scale=_QUERY_PRE_ATTN_SCALAR**-0.5,
        embedding_multiplier=int(g.meta("embedding_length")) ** 0.5,
    )


ARCHITECTURE = Architecture(
    name="gemma3",
    model_class=Gemma3ForCausalLM,
    hf_classes=("Gemma3ForCausalLM",),
    gguf_names=("gemma3",),
    hf_fields=_hf_fields,
    gguf_fields=_gguf_fields,
    gguf_tensors={
        **GGUF_TENSORS,
        "ffn_norm": "pre_feedforward_layernorm",
        "post_attention_norm": "post_attention_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
    gguf_norm_offset=1.0,  # llama.cpp stores Gemma's (1 + w) gains
    # Sandwich norms: before and after attention, before and after the MLP.
    layer_norms=(
        "input_layernorm",
        "post_attention_layernorm",
        "pre_feedforward_layernorm",
        "post_feedforward_layernorm",
    ),
    tool_call_format="pythonic",  # Google's documented format: [f(x=1)]
)

"""OLMo 2: post-norm layers (an RMSNorm on the attention's output and one on the MLP's, each
before the residual add; nothing normalises a layer's input), q/k RMSNorms over the whole q and
k projections before RoPE (OLMoE's attention), SiLU-gated MLP. Tensor parallelism is refused:
a norm over every head needs them all on one rank."""

from __future__ import annotations

import torch
from torch import nn

from inferd.attention.backend import ForwardContext
from inferd.config import ModelConfig
from inferd.distributed.state import TPGroup
from inferd.errors import ModelLoadError
from inferd.layers.norm import scheme_norm
from inferd.layers.weight_scheme import WeightScheme
from inferd.models.architecture import GGUF_TENSORS, Architecture
from inferd.models.base import CausalLM
from inferd.models.decoder_layer_parts import DecoderLayerParts
from inferd.models.llama import GatedMLP
from inferd.models.olmoe import ARCHITECTURE as OLMOE
from inferd.models.olmoe import OlmoeAttention


class Olmo2DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, scheme: WeightScheme, tp: TPGroup):
        super().__init__()
        dim, eps = config.hidden_size, config.rms_norm_eps
        self.activation = config.hidden_act
        self.inputs = scheme.activations  # what the projections take (no input norm casts)
        self.self_attn = OlmoeAttention(config, layer, scheme, tp)
        # The post norms' outputs join the float32 residual stream (see CausalLM.forward).
        self.post_attention_layernorm = scheme_norm(scheme, dim, eps, False, residual=True)
        self.mlp = GatedMLP(config, scheme, tp)
        self.post_feedforward_layernorm = scheme_norm(scheme, dim, eps, False, residual=True)

    def forward(self, h: torch.Tensor, rope, ctx: ForwardContext) -> torch.Tensor:
        h = h + self.post_attention_layernorm(self.self_attn(h.to(self.inputs), rope, ctx))
        return h + self.post_feedforward_layernorm(self.mlp(h.to(self.inputs)))

    def parts(self) -> DecoderLayerParts:
        # NOTE: no norm before attention or MLP; the C layer (which always has them) is off
        # for this family (ARCHITECTURE.c_decoder), LoRA reads only the projections.
        return DecoderLayerParts(
            input_norm=None, attention=self.self_attn, pre_mlp_norm=None, mlp=self.mlp,
            activation=self.activation, post_attention_norm=self.post_attention_layernorm,
            post_mlp_norm=self.post_feedforward_layernorm,
        )  # fmt: skip


class Olmo2ForCausalLM(CausalLM):
    def make_layer(self, config: ModelConfig, layer: int, scheme: WeightScheme, tp: TPGroup):
        return Olmo2DecoderLayer(config, layer, scheme, tp)


def _gguf_fields(g) -> dict:
    # OLMo 3 files are "olmo2" files with sliding windows (and RoPE of their own per layer kind)
    if g.meta("attention.sliding_window", None):
        raise ModelLoadError(f"{g.path}: an olmo2 GGUF file with sliding-window layers (OLMo 3) "
                             "is not supported")  # fmt: skip
    # per-head q/k norms (ModelConfig.qk_norm) are not OLMo 2's: its own are in the attention
    return dict(qk_norm=False)


ARCHITECTURE = Architecture(
    name="olmo2",
    model_class=Olmo2ForCausalLM,
    hf_classes=("Olmo2ForCausalLM",),
    gguf_names=("olmo2",),
    gguf_fields=_gguf_fields,
    gguf_tensors={
        **{k: v for k, v in GGUF_TENSORS.items() if k not in ("attn_norm", "ffn_norm")},
        "post_attention_norm": "post_attention_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
    layer_norms=("post_attention_layernorm", "post_feedforward_layernorm"),
    extra_layer_tensors=OLMOE.extra_layer_tensors,  # q/k norms over whole projections
    c_decoder=False,  # the C layer normalises each layer's input and has per-head q/k norms
    tensor_parallel=False,
)

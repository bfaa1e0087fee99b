"""A decoder layer spelled out as parts: what each family's layer gives (`parts()`) and what the
C decoder (cpu_decoder.py) runs without the layer's forward. Its own module so that the C
decoder needs nothing of the model classes (base.py) that own it."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from inferd.layers.attention import SelfAttention
from inferd.layers.norm import RMSNorm


@dataclass(frozen=True)
class DecoderLayerParts:
    """One decoder layer spelled out, as code that runs a layer without its forward (the C
    decoder layer) needs it. Every architecture's layer says which norms it has:

        h += post_attention_norm(attention(input_norm(h)))       (no post norm: h += attention)
        h += post_mlp_norm(mlp(pre_mlp_norm(h)))                  (no post norm: h += mlp)

    each added term times `residual_multiplier` (Granite's; 1 elsewhere).
    """

    input_norm: RMSNorm | None  # None: OLMo 2's post-norm layers (not for the C layer)
    attention: SelfAttention
    pre_mlp_norm: RMSNorm | None
    mlp: nn.Module  # a GatedMLP (gate_up_proj, down_proj, act), or a SparseMoE (layers/moe.py)
    activation: str  # the config's hidden_act
    post_attention_norm: RMSNorm | None = None  # Gemma's sandwich norms
    post_mlp_norm: RMSNorm | None = None
    residual_multiplier: float = 1.0

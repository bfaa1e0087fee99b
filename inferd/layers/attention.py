"""Self-attention over the paged KV cache: fused q/k/v projection, optional per-head q/k
RMSNorm (Qwen3, Gemma 3), RoPE, then the step's attention backend."""

from __future__ import annotations

import torch
from torch import nn

from inferd.attention.backend import ForwardContext, LayerAttentionSpec
from inferd.config import ModelConfig
from inferd.layers.linear import Linear
from inferd.layers.norm import RMSNorm
from inferd.layers.rotary import apply_rotary


def attention_spec(config: ModelConfig, layer: int) -> LayerAttentionSpec:
    for group, (_, layers) in enumerate(config.kv_groups()):
        if layer in layers:
            return LayerAttentionSpec(
                num_heads=config.num_heads,
                num_kv_heads=config.num_kv_heads,
                head_dim=config.head_dim,
                scale=config.scale,
                window=config.layer_window(layer),
                softcap=config.attn_logit_softcapping,
                group=group,
                index_in_group=layers.index(layer),
            )
    raise AssertionError(f"layer {layer} is in no KV group")


class SelfAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, dtype: torch.dtype, norm_offset: bool):
        super().__init__()
        self.spec = attention_spec(config, layer)
        hd, nh, nkv = config.head_dim, config.num_heads, config.num_kv_heads
        self.q_size, self.kv_size = nh * hd, nkv * hd
        self.qkv_proj = Linear(
            config.hidden_size, [nh * hd, nkv * hd, nkv * hd], config.attention_bias, dtype
        )
        self.o_proj = Linear(nh * hd, config.hidden_size, False, dtype)
        if config.qk_norm:
            self.q_norm = RMSNorm(hd, config.rms_norm_eps, norm_offset, dtype)
            self.k_norm = RMSNorm(hd, config.rms_norm_eps, norm_offset, dtype)
        else:
            self.q_norm = self.k_norm = None

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        ctx: ForwardContext,
    ) -> torch.Tensor:
        n = x.shape[0]
        hd = self.spec.head_dim
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(n, -1, hd)
        k = k.view(n, -1, hd)
        v = v.view(n, -1, hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = ctx.attend(self.spec, q, k, v)
        return self.o_proj(out.reshape(n, -1))

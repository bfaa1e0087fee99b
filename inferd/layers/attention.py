"""Self-attention over the paged KV cache: fused q/k/v projection, optional per-head q/k
RMSNorm (Qwen3, Gemma 3), RoPE, then the step's attention backend."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inferd.attention.backend import ForwardContext, LayerAttentionSpec
from inferd.config import ModelConfig
from inferd.distributed.state import SINGLE, TPGroup, kv_head_range
from inferd.layers.linear import Linear
from inferd.layers.norm import kernel_rms_norm, scheme_norm, stacked_gain
from inferd.layers.rotary import apply_rotary
from inferd.layers.weight_scheme import WeightScheme


def attention_spec(config: ModelConfig, layer: int, num_heads: int | None = None,
                   num_kv_heads: int | None = None) -> LayerAttentionSpec:  # fmt: skip
    """The spec of `layer`; under tensor parallelism with this rank's head counts."""
    for group, (_, layers) in enumerate(config.kv_groups()):
        if layer in layers:
            return LayerAttentionSpec(
                num_heads=num_heads or config.num_heads,
                num_kv_heads=num_kv_heads or config.num_kv_heads,
                head_dim=config.head_dim,
                scale=config.scale,
                window=config.layer_window(layer),
                softcap=config.attn_logit_softcapping,
                group=group,
                index_in_group=layers.index(layer),
            )
    raise AssertionError(f"layer {layer} is in no KV group")


class SelfAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, scheme: WeightScheme, norm_offset: bool,
                 tp: TPGroup = SINGLE):  # fmt: skip
        super().__init__()
        hd, nh, nkv = config.head_dim, config.num_heads, config.num_kv_heads
        q0, nq = tp.split(nh, "the number of attention heads")
        k0, nk = kv_head_range(nkv, tp)
        self.spec = attention_spec(config, layer, nq, nk)
        self.q_size, self.kv_size = nq * hd, nk * hd
        rows = [(q0 * hd, nq * hd), (k0 * hd, nk * hd), (k0 * hd, nk * hd)]
        self.qkv_proj = Linear(config.hidden_size, [nh * hd, nkv * hd, nkv * hd],
                               config.attention_bias, scheme, row_ranges=rows, tp=tp)  # fmt: skip
        cols = (q0 * hd, nq * hd) if tp.enabled else None  # row-parallel: this rank's heads
        if config.output_bias and tp.enabled:  # each rank would add it before the all-reduce
            raise ValueError("an o_proj bias (gpt-oss) cannot be split over tensor_parallel_size "
                             f"{tp.world_size}")  # fmt: skip
        self.o_proj = Linear(nh * hd, config.hidden_size, config.output_bias, scheme,
                             col_range=cols, tp=tp)  # fmt: skip
        if config.qk_norm:
            self.q_norm = scheme_norm(scheme, hd, config.rms_norm_eps, norm_offset)
            self.k_norm = scheme_norm(scheme, hd, config.rms_norm_eps, norm_offset)
        else:
            self.q_norm = self.k_norm = None
        self._qk_gain: torch.Tensor | None = None

    def finalize(self) -> None:
        """After loading: q and k norms as one [q heads + kv heads, head_dim] gain, so one
        normalisation and one rotation cover both (fewer ops per decode step)."""
        if self.q_norm is not None:
            s = self.spec
            self._qk_gain = stacked_gain(
                [(self.q_norm, s.num_heads), (self.k_norm, s.num_kv_heads)]
            )

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        ctx: ForwardContext,
    ) -> torch.Tensor:
        n = x.shape[0]
        s = self.spec
        qkv = self.qkv_proj(x).view(n, s.num_heads + 2 * s.num_kv_heads, s.head_dim)
        qk, v = qkv[:, : s.num_heads + s.num_kv_heads], qkv[:, s.num_heads + s.num_kv_heads :]
        # q and k continue in float32: normalised, rotated, then the backend stores k in the
        # cache dtype and attends in float32 (decode) or the cache dtype (prefill).
        if self._qk_gain is not None and self.q_norm.kernel is not None:
            qk = kernel_rms_norm(self.q_norm.kernel, qk.float(), None, self.q_norm.eps)
            qk = qk.mul_(self._qk_gain)
        elif self._qk_gain is not None:
            qk = F.rms_norm(qk.float(), (s.head_dim,), None, self.q_norm.eps) * self._qk_gain
        elif self.q_norm is not None:
            qk = torch.cat(
                [self.q_norm(qk[:, : s.num_heads]), self.k_norm(qk[:, s.num_heads :])], 1
            )
            qk = qk.float()
        else:
            qk = qk.float()
        qk = apply_rotary(qk, *rope)
        if not ctx.backend.float32_queries:
            qk = qk.to(x.dtype)
        out = ctx.attend(s, qk[:, : s.num_heads], qk[:, s.num_heads :], v)
        return self.o_proj(out.reshape(n, -1))

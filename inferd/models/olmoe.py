"""OLMoE (OLMoE-1B-7B): Llama's layer with a Mixture of Experts for every MLP (no shared expert,
top-k weights not renormalised by default) and q/k RMSNorms over the whole q and k projections
(not per head) before RoPE. `clip_qkv` is refused; so is tensor parallelism (a norm over every
head needs them all on one rank)."""

from __future__ import annotations

import torch

from inferd.attention.backend import ForwardContext
from inferd.config import ModelConfig, MoEConfig
from inferd.distributed.state import TPGroup
from inferd.errors import ModelLoadError
from inferd.layers.attention import SelfAttention
from inferd.layers.norm import scheme_norm
from inferd.layers.rotary import apply_rotary
from inferd.layers.weight_scheme import WeightScheme
from inferd.models.architecture import GGUF_MOE_TENSORS, Architecture
from inferd.models.llama import LlamaDecoderLayer, LlamaForCausalLM


class OlmoeAttention(SelfAttention):
    """Self-attention whose q and k are normalised across all their heads at once."""

    def __init__(self, config: ModelConfig, layer: int, scheme: WeightScheme, tp: TPGroup):
        if tp.enabled:
            raise ValueError("OLMoE's q/k norms span every head: it cannot be split over "
                             f"tensor_parallel_size {tp.world_size}")  # fmt: skip
        super().__init__(config, layer, scheme, norm_offset=False, tp=tp)
        eps = config.rms_norm_eps
        # float32 out: q and k continue in float32 into RoPE, as in SelfAttention
        self.q_norm = scheme_norm(scheme, self.q_size, eps, False, residual=True)
        self.k_norm = scheme_norm(scheme, self.kv_size, eps, False, residual=True)

    def finalize(self) -> None:
        """Nothing to stack: the norms are not per head."""

    def forward(self, x: torch.Tensor, rope, ctx: ForwardContext) -> torch.Tensor:
        n, s = x.shape[0], self.spec
        qkv = self.qkv_proj(x)
        q, k = qkv[:, : self.q_size], qkv[:, self.q_size : self.q_size + self.kv_size]
        v = qkv[:, self.q_size + self.kv_size :].view(n, s.num_kv_heads, s.head_dim)
        qk = torch.cat([self.q_norm(q), self.k_norm(k)], dim=1)
        qk = apply_rotary(qk.view(n, s.num_heads + s.num_kv_heads, s.head_dim), *rope)
        if not ctx.backend.float32_queries:
            qk = qk.to(x.dtype)
        out = ctx.attend(s, qk[:, : s.num_heads], qk[:, s.num_heads :], v)
        return self.o_proj(out.reshape(n, -1))


class OlmoeDecoderLayer(LlamaDecoderLayer):
    def make_attention(self, config: ModelConfig, layer: int, scheme: WeightScheme,
                       tp: TPGroup) -> SelfAttention:  # fmt: skip
        return OlmoeAttention(config, layer, scheme, tp)


class OlmoeForCausalLM(LlamaForCausalLM):
    def make_layer(self, config: ModelConfig, layer: int, scheme: WeightScheme, tp: TPGroup):
        return OlmoeDecoderLayer(config, layer, scheme, tp)


def _hf_fields(r) -> dict:
    if r.cfg.get("clip_qkv") is not None:
        raise ModelLoadError(f"{r.source}: clip_qkv is not supported")
    moe = MoEConfig(
        num_experts=r.int("num_experts"),
        top_k=r.int("num_experts_per_tok"),
        intermediate_size=r.int("intermediate_size"),
        normalize_top_k=r.bool("norm_topk_prob", False),
    )
    return dict(moe=moe)


def _norm_tensors(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    return {"self_attn.q_norm.weight": (c.num_heads * c.head_dim,),
            "self_attn.k_norm.weight": (c.num_kv_heads * c.head_dim,)}  # fmt: skip


ARCHITECTURE = Architecture(
    name="olmoe",
    model_class=OlmoeForCausalLM,
    hf_classes=("OlmoeForCausalLM",),
    gguf_names=("olmoe",),
    moe=True,
    hf_fields=_hf_fields,
    # per-head q/k norms (ModelConfig.qk_norm) are not OLMoE's: its own are in the attention
    gguf_fields=lambda g: dict(qk_norm=False, moe=g.experts(normalize_top_k=False)),
    gguf_tensors=GGUF_MOE_TENSORS,
    extra_layer_tensors=_norm_tensors,
    c_decoder=False,
    tensor_parallel=False,
)

"""Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B): Qwen3's attention (per-head q/k norms) with a Mixture
of Experts for the MLP (no shared expert); `decoder_sparse_step` and `mlp_only_layers` keep some
layers dense. Sliding-window attention in every layer when `use_sliding_window` is set."""

from __future__ import annotations

from inferd.config import MoEConfig
from inferd.models.architecture import GGUF_MOE_TENSORS, Architecture
from inferd.models.llama import LlamaForCausalLM


def qwen_experts(r, shared: bool) -> MoEConfig | None:
    """Qwen2-MoE / Qwen3-MoE experts from config.json (None: `num_experts` 0, all dense)."""
    n = r.int("num_hidden_layers")
    # transformers 5 writes Qwen3-MoE's count as num_local_experts; published configs num_experts
    key = "num_experts" if "num_experts" in r.cfg else "num_local_experts"
    experts = r.int(key, low=0)
    if experts == 0:
        return None
    step = r.int("decoder_sparse_step", 1)
    only = set(r.int_list("mlp_only_layers", n - 1))
    shared_size = r.int("shared_expert_intermediate_size") if shared else 0
    return MoEConfig(
        num_experts=experts,
        top_k=r.int("num_experts_per_tok"),
        intermediate_size=r.int("moe_intermediate_size"),
        normalize_top_k=r.bool("norm_topk_prob", False),
        shared_intermediate_size=shared_size,
        shared_gate=shared,
        dense_layers=tuple(i for i in range(n) if i in only or (i + 1) % step),
    )


def _hf_fields(r) -> dict:
    sliding = r.bool("use_sliding_window", False)
    return dict(qk_norm=True, moe=qwen_experts(r, shared=False),
                layer_types=r.sliding_everywhere() if sliding else ())  # fmt: skip


ARCHITECTURE = Architecture(
    name="qwen3_moe",
    model_class=LlamaForCausalLM,
    hf_classes=("Qwen3MoeForCausalLM",),
    gguf_names=("qwen3moe",),
    moe=True,
    hf_fields=_hf_fields,
    # llama.cpp renormalises Qwen3-MoE's top-k weights whatever norm_topk_prob said
    gguf_fields=lambda g: dict(moe=g.experts(normalize_top_k=True)),
    gguf_tensors=GGUF_MOE_TENSORS,
    c_decoder=False,
)

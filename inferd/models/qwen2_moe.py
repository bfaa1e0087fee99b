"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention (q/k/v biases, `qkv_bias`) with a
Mixture of Experts plus a shared expert every token uses, scaled by a sigmoid gate. HF's
sliding pattern, when `use_sliding_window` is set: every other layer below `max_window_layers`."""

from __future__ import annotations

from inferd.config import FULL_ATTENTION, SLIDING_ATTENTION
from inferd.models.architecture import GGUF_MOE_TENSORS, Architecture
from inferd.models.llama import LlamaForCausalLM
from inferd.models.qwen3_moe import qwen_experts


def _hf_fields(r) -> dict:
    n = r.int("num_hidden_layers")
    sliding = r.bool("use_sliding_window", False)
    first_full = r.int("max_window_layers", n, low=0)
    types = tuple(SLIDING_ATTENTION if sliding and (i + 1) % 2 and i < first_full
                  else FULL_ATTENTION for i in range(n))  # fmt: skip
    return dict(attention_bias=r.bool("qkv_bias", True), moe=qwen_experts(r, shared=True),
                layer_types=types)  # fmt: skip


ARCHITECTURE = Architecture(
    name="qwen2_moe",
    model_class=LlamaForCausalLM,
    hf_classes=("Qwen2MoeForCausalLM",),
    gguf_names=("qwen2moe",),
    moe=True,
    hf_fields=_hf_fields,
    hf_attention_bias=False,  # its key is qkv_bias; o_proj never has one
    gguf_fields=lambda g: dict(moe=g.experts(normalize_top_k=False)),
    gguf_tensors=GGUF_MOE_TENSORS,
    c_decoder=False,
)

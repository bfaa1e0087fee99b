"""Qwen3: Llama's layer with an RMSNorm over each head of q and k (before RoPE), no biases."""

from __future__ import annotations

from inferd.models.architecture import Architecture
from inferd.models.llama import LlamaForCausalLM
from inferd.models.qwen2 import qwen_sliding_layers

ARCHITECTURE = Architecture(
    name="qwen3",
    model_class=LlamaForCausalLM,
    hf_classes=("Qwen3ForCausalLM",),
    gguf_names=("qwen3",),
    hf_fields=lambda r: dict(qk_norm=True, layer_types=qwen_sliding_layers(r)),
)

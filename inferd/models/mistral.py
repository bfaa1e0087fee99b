"""Mistral: Llama's layer with sliding-window attention in every layer when the config sets
`sliding_window` (Mistral 7B v0.1: 4096 tokens). Its GGUF files are "llama" files, read by the
Llama record (llama.cpp stores the window as `llama.attention.sliding_window` when it keeps it)."""

from __future__ import annotations

from inferd.models.architecture import Architecture
from inferd.models.llama import LlamaForCausalLM

ARCHITECTURE = Architecture(
    name="mistral",
    model_class=LlamaForCausalLM,
    hf_classes=("MistralForCausalLM",),
    hf_fields=lambda r: dict(layer_types=r.sliding_everywhere()),
    hf_attention_bias=False,  # HF's Mistral has no biases and no such key
)

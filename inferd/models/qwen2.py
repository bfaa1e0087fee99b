"""Qwen2 (Qwen2.5): Llama's layer with biases on the q, k and v projections, and sliding-window
attention in the layers from `max_window_layers` on when `use_sliding_window` is set."""

from __future__ import annotations

from inferd.config import FULL_ATTENTION, SLIDING_ATTENTION
from inferd.models.architecture import Architecture
from inferd.models.llama import LlamaForCausalLM


def qwen_sliding_layers(r) -> tuple[str, ...]:
    """HF Qwen2/Qwen3: layers at or after `max_window_layers` slide, when enabled."""
    n = r.int("num_hidden_layers")
    if not r.bool("use_sliding_window", False) or not r.int("sliding_window", None, low=0):
        return (FULL_ATTENTION,) * n
    first = r.int("max_window_layers", n, low=0)
    return tuple(SLIDING_ATTENTION if i >= first else FULL_ATTENTION for i in range(n))


ARCHITECTURE = Architecture(
    name="qwen2",
    model_class=LlamaForCausalLM,
    hf_classes=("Qwen2ForCausalLM",),
    gguf_names=("qwen2",),
    hf_fields=lambda r: dict(attention_bias=True, layer_types=qwen_sliding_layers(r)),
    hf_attention_bias=False,  # HF's Qwen2 always has q/k/v biases, never an o_proj bias
)

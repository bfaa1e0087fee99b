"""Which model class runs which checkpoint: HF `architectures` names and GGUF
`general.architecture` names both map to one inferd architecture key."""

from __future__ import annotations

from torch import nn

from inferd.errors import ModelLoadError

# HF config `architectures` entry → inferd key
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma3ForCausalLM": "gemma3",
}
# GGUF general.architecture → inferd key
GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3"}


def supported_architectures() -> list[str]:
    return sorted(ARCHITECTURES)


def model_class(kind: str) -> type[nn.Module]:
    # Imported lazily so reading a config does not import every model.
    if kind in ("llama", "qwen2", "qwen3"):
        from inferd.models.llama import LlamaForCausalLM

        return LlamaForCausalLM
    if kind == "gemma3":
        from inferd.models.gemma3 import Gemma3ForCausalLM

        return Gemma3ForCausalLM
    raise ModelLoadError(f"unsupported architecture {kind!r}")

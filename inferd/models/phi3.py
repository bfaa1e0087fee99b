"""Phi-3 (mini, medium): Llama's layer, stored fused: one `qkv_proj` ([q; k; v] rows) and one
`gate_up_proj` ([gate; up] rows) per layer, in HF folders and GGUF files alike (llama.cpp's
`attn_qkv`, and `ffn_up` holding gate and up). Sliding-window attention in every layer when
`sliding_window` is set (Phi-3 mini 4k: 2047). RoPE over whole heads only: a
`partial_rotary_factor` below 1 (Phi-4 mini) and the long-context `longrope` scaling are
refused."""

from __future__ import annotations

from inferd.errors import ModelLoadError
from inferd.models.architecture import GGUF_TENSORS, Architecture, split_gate_up, split_qkv
from inferd.models.llama import LlamaForCausalLM


def _hf_fields(r) -> dict:
    params = r.cfg.get("rope_parameters") or {}
    factor = params.get("partial_rotary_factor", r.cfg.get("partial_rotary_factor", 1.0))
    if factor != 1.0:
        raise ModelLoadError(f"{r.source}: partial_rotary_factor {factor!r} is not supported "
                             "(inferd rotates whole heads: 1.0)")  # fmt: skip
    return dict(layer_types=r.sliding_everywhere())


def _gguf_fields(g) -> dict:
    if g.has_tensor("rope_factors_long.weight") or g.has_tensor("rope_factors_short.weight"):
        raise ModelLoadError(f"{g.path}: Phi-3's long-context RoPE factors (longrope) are not "
                             "supported")  # fmt: skip
    return {}


ARCHITECTURE = Architecture(
    name="phi3",
    model_class=LlamaForCausalLM,
    hf_classes=("Phi3ForCausalLM",),
    gguf_names=("phi3",),
    hf_fields=_hf_fields,
    hf_attention_bias=False,
    gguf_fields=_gguf_fields,
    gguf_tensors={**GGUF_TENSORS, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
    fused={"self_attn.qkv_proj": split_qkv, "mlp.gate_up_proj": split_gate_up},
)

"""An `Architecture` record: what inferd knows about one model family, kept in the family's model
file (llama.py, phi3.py, qwen3_moe.py, ...) and found by name through registry.py.

A record says
* which checkpoints it reads: HF `architectures` class names, GGUF `general.architecture` names;
* how their configs become a `ModelConfig`: the family's own fields (`hf_fields`, `gguf_fields`)
  on top of what every family shares (inferd/loader/hf_config.py, inferd/loader/gguf_model.py);
* how their tensors are named: GGUF `blk.N.*` names to HF names, the value conventions of
  llama.cpp's converter (q/k rows reordered, norm gains offset), HF spellings of the family's own
  (`renames`) and fused tensors to split (`fused`);
* every tensor a layer holds and its shape (`layer_tensors`): the loader checks the checkpoint
  against it before allocating anything, and `inferd memory` counts parameters from it;
* the tool-call format of its chat models, whether the C decode layer computes its layers, and
  whether tensor parallelism can split them.

Adding a dense family that computes like one already here is one model file holding a record,
and one name in registry.py's FAMILIES (docs/architecture.md has the recipe).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from inferd.config import ModelConfig

# GGUF per-layer tensor `blk.N.<key>.weight` → its HF name under `model.layers.N.` (llama.cpp's
# names, gguf-py's tensor_mapping.py).
GGUF_TENSORS: Mapping[str, str] = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Mixture-of-Experts layers: the router, the experts stacked [experts, rows, cols] (the loader
# reads them one expert at a time), and a shared expert with its gate.
GGUF_MOE_TENSORS: Mapping[str, str] = {
    **GGUF_TENSORS,
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
PRE_NORMS = ("input_layernorm", "post_attention_layernorm")  # before attention, before the MLP


def _no_fields(reader: Any) -> dict[str, Any]:
    return {}


def _no_tensors(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    return {}


def split_qkv(config: ModelConfig) -> tuple[tuple[str, int], ...]:
    """A fused [q; k; v] projection's parts and their rows (Phi-3's `qkv_proj`)."""
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    return (("self_attn.q_proj", q), ("self_attn.k_proj", kv), ("self_attn.v_proj", kv))


def split_gate_up(config: ModelConfig) -> tuple[tuple[str, int], ...]:
    """A fused [gate; up] projection's parts (Phi-3's `gate_up_proj`: gate first)."""
    inter = config.intermediate_size
    return (("mlp.gate_proj", inter), ("mlp.up_proj", inter))


@dataclass(frozen=True)
class Architecture:
    name: str  # ModelConfig.architecture
    model_class: type  # the CausalLM subclass that computes it
    hf_classes: tuple[str, ...]  # config.json `architectures` entries it reads
    gguf_names: tuple[str, ...] = ()  # GGUF `general.architecture` values it reads
    moe: bool = False  # its MLPs are Mixtures of Experts (a GGUF name may serve both kinds)
    # The family's own ModelConfig fields, from config.json (given the loader's ConfigReader)
    # and from GGUF metadata (given a GGUFReader); both run after the shared fields are read.
    hf_fields: Callable[[Any], dict[str, Any]] = _no_fields
    # Whether the HF class reads config.json's `attention_bias` (a bias on all four projections,
    # which inferd refuses); Qwen2's always has q/k/v biases and ignores the key.
    hf_attention_bias: bool = True
    gguf_fields: Callable[[Any], dict[str, Any]] = _no_fields
    gguf_tensors: Mapping[str, str] = field(default_factory=lambda: GGUF_TENSORS)
    # llama.cpp's converter reorders q/k rows of Llama-style RoPE models ("rotate half" → pairs)
    gguf_qk_permuted: bool = False
    gguf_norm_offset: float = 0.0  # added to every norm gain by llama.cpp's converter
    # (spelling, inferd's spelling) substrings of HF names, e.g. Mixtral's block_sparse_moe.
    renames: tuple[tuple[str, str], ...] = ()
    # A fused checkpoint tensor (layer sub-name) → its parts and their rows, in order.
    fused: Mapping[str, Callable[[ModelConfig], tuple[tuple[str, int], ...]]] = field(
        default_factory=dict
    )
    # The family's own stored layout (gpt-oss's packed, interleaved experts and MXFP4 blocks):
    # the checkpoint's (name, lazy weight) pairs → pairs the shared normalisation then reads
    # (loader/tensor_layout.py); None: nothing of its own.
    tensor_layout: Callable[[Iterable[tuple[str, Any]], ModelConfig],
                            Iterator[tuple[str, Any]]] | None = None  # fmt: skip
    layer_norms: tuple[str, ...] = PRE_NORMS  # each `hidden` wide
    # Tensors of a layer only this family has (OLMoE's q/k norms over whole projections).
    extra_layer_tensors: Callable[[ModelConfig], dict[str, tuple[int, ...]]] = _no_tensors
    # forced tool calls: "hermes" (ChatML), "pythonic", or "harmony" (gpt-oss's channels)
    tool_call_format: str = "hermes"
    c_decoder: bool = True  # cpu_decoder.py computes its layers (dense gated MLPs only)
    tensor_parallel: bool = True  # its layers can be split over ranks (inferd/distributed/)
    # A vision-language checkpoint's config.json key holding its text model's config (the
    # shared fields are read there; `hf_fields` still sees the whole file); None: top level.
    hf_text_config: str | None = None
    # Tensors outside the decoder layers only this family has (a vision tower, a projector),
    # with their shapes: the loader checks them as it checks the layers'.
    model_tensors: Callable[[ModelConfig], dict[str, tuple[int, ...]]] = _no_tensors

    @property
    def norms_per_layer(self) -> int:
        return len(self.layer_norms)

    def layer_tensors(self, config: ModelConfig, layer: int) -> dict[str, tuple[int, ...]]:
        """Every tensor of `layer` (HF names under `model.layers.N.`, experts one by one) with
        its shape: what a checkpoint must store, and what the model's parameters count."""
        c, h = config, config.hidden_size
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        out: dict[str, tuple[int, ...]] = {
            "self_attn.q_proj.weight": (q, h),
            "self_attn.k_proj.weight": (kv, h),
            "self_attn.v_proj.weight": (kv, h),
            "self_attn.o_proj.weight": (h, q),
        }
        if c.attention_bias:  # on q, k and v only (Qwen2)
            out.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,),
                        "self_attn.v_proj.bias": (kv,)})  # fmt: skip
        if c.output_bias:  # gpt-oss
            out["self_attn.o_proj.bias"] = (h,)
        if c.qk_norm:  # one gain over each head, shared by the heads
            out.update({"self_attn.q_norm.weight": (c.head_dim,),
                        "self_attn.k_norm.weight": (c.head_dim,)})  # fmt: skip
        out.update(self.extra_layer_tensors(c))
        out.update({f"{norm}.weight": (h,) for norm in self.layer_norms})
        if c.is_moe_layer(layer):
            out.update(moe_tensors(c))
        else:
            out.update(gated_mlp_tensors("mlp", h, c.intermediate_size))
        return out


def gated_mlp_tensors(prefix: str, hidden: int, inter: int) -> dict[str, tuple[int, ...]]:
    return {
        f"{prefix}.gate_proj.weight": (inter, hidden),
        f"{prefix}.up_proj.weight": (inter, hidden),
        f"{prefix}.down_proj.weight": (hidden, inter),
    }


def moe_tensors(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """A Mixture-of-Experts MLP's tensors: router, experts, shared expert and its gate."""
    moe, h = config.moe, config.hidden_size
    assert moe is not None
    out: dict[str, tuple[int, ...]] = {"mlp.gate.weight": (moe.num_experts, h)}
    for e in range(moe.num_experts):
        out.update(gated_mlp_tensors(f"mlp.experts.{e}", h, moe.intermediate_size))
    if moe.biases:  # gpt-oss: the router's and each expert's
        out["mlp.gate.bias"] = (moe.num_experts,)
        for e in range(moe.num_experts):
            out.update({f"mlp.experts.{e}.{kind}.bias": (rows,) for kind, rows in (
                ("gate_proj", moe.intermediate_size), ("up_proj", moe.intermediate_size),
                ("down_proj", h))})  # fmt: skip
    if moe.shared_intermediate_size:
        out.update(gated_mlp_tensors("mlp.shared_expert", h, moe.shared_intermediate_size))
    if moe.shared_gate:
        out["mlp.shared_expert_gate.weight"] = (1, h)
    return out


def is_expert_tensor(name: str) -> bool:
    """Whether a layer tensor name (as `layer_tensors` spells it) is one routed expert's."""
    return name.startswith("mlp.experts.")

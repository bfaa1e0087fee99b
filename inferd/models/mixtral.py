"""Mixtral (8x7B, 8x22B): Llama's attention (sliding window in every layer when set) with a
Mixture of Experts whose top-k weights are always renormalised. Checkpoints before transformers
5 name it `block_sparse_moe` with experts' `w1` (gate), `w3` (up), `w2` (down); its GGUF files
are "llama" files that hold experts."""

from __future__ import annotations

from inferd.config import MoEConfig
from inferd.models.architecture import GGUF_MOE_TENSORS, Architecture
from inferd.models.llama import LlamaForCausalLM


def _hf_fields(r) -> dict:
    moe = MoEConfig(
        num_experts=r.int("num_local_experts"),
        top_k=r.int("num_experts_per_tok"),
        intermediate_size=r.int("intermediate_size"),
        normalize_top_k=True,
    )
    return dict(moe=moe, layer_types=r.sliding_everywhere())


ARCHITECTURE = Architecture(
    name="mixtral",
    model_class=LlamaForCausalLM,
    hf_classes=("MixtralForCausalLM",),
    gguf_names=("llama",),
    moe=True,
    hf_fields=_hf_fields,
    hf_attention_bias=False,
    gguf_fields=lambda g: dict(moe=g.experts(normalize_top_k=True)),
    gguf_tensors=GGUF_MOE_TENSORS,
    gguf_qk_permuted=True,
    renames=(
        (".block_sparse_moe.", ".mlp."),
        (".w1.", ".gate_proj."),
        (".w3.", ".up_proj."),
        (".w2.", ".down_proj."),
    ),
    c_decoder=False,
)

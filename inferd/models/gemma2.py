"""Gemma 2: Gemma 3's layer without q/k norms (sandwich norms, (1 + w) RMSNorms, GELU-tanh MLP,
embeddings scaled by sqrt(hidden)), one RoPE base for every layer, sliding-window attention on
alternate layers (the first slides), and tanh soft-capping of the attention scores and of the
final logits."""

from __future__ import annotations

from inferd.config import FULL_ATTENTION, SLIDING_ATTENTION
from inferd.models.architecture import Architecture
from inferd.models.gemma3 import ARCHITECTURE as GEMMA3
from inferd.models.gemma3 import Gemma3ForCausalLM


class Gemma2ForCausalLM(Gemma3ForCausalLM):
    """Gemma 3's layer computes Gemma 2's: its q/k norms exist only where `qk_norm` is set, and
    Gemma 2's config never sets it."""


# Gemma 2 facts llama.cpp's converter does not store: llama.cpp's defaults (llama-model.cpp).
_WINDOW = 4096
_ATTN_SOFTCAP, _FINAL_SOFTCAP = 50.0, 30.0
_LAYERS_27B = 46  # the one size whose query scale is not 1/sqrt(head_dim)


def _alternating(n: int) -> tuple[str, ...]:
    """HF's and llama.cpp's rule when a config lists no layer types: even layers slide."""
    return tuple(SLIDING_ATTENTION if i % 2 == 0 else FULL_ATTENTION for i in range(n))


def _hf_fields(r) -> dict:
    """config.json: the query scale from `query_pre_attn_scalar`, both soft-caps (HF's defaults
    when absent). An explicit `layer_types` list replaces the alternating rule (hf_config.py)."""
    return dict(
        hidden_act=r.str("hidden_activation", None) or r.str("hidden_act", None)
        or "gelu_pytorch_tanh",
        layer_types=_alternating(r.int("num_hidden_layers")),
        query_scale=r.number("query_pre_attn_scalar", 256.0) ** -0.5,
        embedding_multiplier=r.int("hidden_size") ** 0.5,
        tie_word_embeddings=r.bool("tie_word_embeddings", True),
        final_logit_softcapping=r.number("final_logit_softcapping", None),
        attn_logit_softcapping=r.number("attn_logit_softcapping", None),
    )  # fmt: skip


def _gguf_fields(g) -> dict:
    """llama.cpp's converter writes neither `query_pre_attn_scalar` nor the layer pattern: its
    loader takes 1/sqrt(head_dim) as the query scale, except for the 27B (46 layers), where it
    is 1/sqrt(hidden / heads), and makes even layers slide."""
    hidden, heads = int(g.meta("embedding_length")), int(g.meta("attention.head_count"))
    head_dim = int(g.meta("attention.key_length", hidden // heads))
    scale_dim = hidden // heads if g.num_layers == _LAYERS_27B else head_dim
    return dict(
        hidden_act="gelu_pytorch_tanh",
        layer_types=_alternating(g.num_layers),
        sliding_window=int(g.meta("attention.sliding_window", _WINDOW)),
        query_scale=scale_dim**-0.5,
        embedding_multiplier=hidden**0.5,
        attn_logit_softcapping=float(g.meta("attn_logit_softcapping", _ATTN_SOFTCAP)),
        final_logit_softcapping=float(g.meta("final_logit_softcapping", _FINAL_SOFTCAP)),
    )


ARCHITECTURE = Architecture(
    name="gemma2",
    model_class=Gemma2ForCausalLM,
    hf_classes=("Gemma2ForCausalLM",),
    gguf_names=("gemma2",),
    hf_fields=_hf_fields,
    gguf_fields=_gguf_fields,
    gguf_tensors=GEMMA3.gguf_tensors,  # the same sandwich-norm names
    gguf_norm_offset=1.0,  # llama.cpp stores Gemma's (1 + w) gains
    layer_norms=GEMMA3.layer_norms,
    tool_call_format="pythonic",  # Google's documented format: [f(x=1)]
)

"""gpt-oss (gpt-oss-20b, gpt-oss-120b): Llama's pre-norm layer with

* attention sinks: per query head a learned logit in each softmax's denominator (the backends'
  `LayerAttentionSpec.sinks`), biases on q, k, v and o, YaRN RoPE, and sliding-window layers
  (even layers) alternating with full attention;
* a Mixture of Experts in every layer: a router with a bias whose softmax runs over the chosen
  experts' logits, experts with biases and the clamped SwiGLU (layers/moe.py, activation.py).

HF checkpoints pack the experts: `gate_up_proj` [experts, hidden, 2 x inter] with gate and up
interleaved along the last dim (even: gate), `down_proj` [experts, inter, hidden], both stored
input by output, and their biases; published ones store them as MXFP4 blocks instead
(`*_blocks`, `*_scales`, output by input: loader/hf_mxfp4.py). `_layout` turns either into
one matrix per expert and kind, so the loader and the block kernels read them like any other
family's. GGUF files (llama.cpp's `gpt-oss`) store gate and up apart already.

The C decoder layer computes neither sinks nor an o_proj bias nor experts: off. Tensor
parallelism is refused (a row-parallel o_proj would add its bias on every rank).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from inferd.config import FULL_ATTENTION, SLIDING_ATTENTION, ModelConfig, MoEConfig, RopeConfig
from inferd.distributed.state import TPGroup
from inferd.layers.attention import SelfAttention
from inferd.layers.weight_scheme import WeightScheme
from inferd.models.architecture import GGUF_MOE_TENSORS, Architecture
from inferd.models.llama import LlamaDecoderLayer, LlamaForCausalLM

SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0  # HF's defaults; llama.cpp's fixed values
ROPE_THETA = 150_000.0  # HF's default_theta for gpt-oss


class GptOssAttention(SelfAttention):
    """SelfAttention with a sink logit per query head (float32, this rank's heads)."""

    def __init__(self, config: ModelConfig, layer: int, scheme: WeightScheme, tp: TPGroup):
        super().__init__(config, layer, scheme, norm_offset=False, tp=tp)
        self.sinks = nn.Parameter(torch.empty(self.spec.num_heads, dtype=torch.float32),
                                  requires_grad=False)  # fmt: skip

    def finalize(self) -> None:
        """After loading: the backends read the sinks from the layer's spec."""
        super().finalize()
        sinks = self.sinks.detach().float().contiguous()
        self.spec = dataclasses.replace(self.spec, sinks=sinks)


class GptOssDecoderLayer(LlamaDecoderLayer):
    def make_attention(self, config: ModelConfig, layer: int, scheme: WeightScheme,
                       tp: TPGroup) -> SelfAttention:  # fmt: skip
        return GptOssAttention(config, layer, scheme, tp)


class GptOssForCausalLM(LlamaForCausalLM):
    def make_layer(self, config: ModelConfig, layer: int, scheme: WeightScheme, tp: TPGroup):
        return GptOssDecoderLayer(config, layer, scheme, tp)


# ---- the stored layout ---------------------------------------------------------------------
_PACKED = re.compile(r"(model\.layers\.\d+\.mlp\.experts\.)(gate_up_proj|down_proj)(_bias)?$")
_STACKED_BIAS = re.compile(r"(model\.layers\.\d+\.mlp\.experts\.)(\w+_proj)\.bias$")


class _Transposed:
    """A 2-D lazy weight stored [in, out] read as [out, in]; `start`, `step`: only its output
    columns start, start + step, ... (gate and up interleaved)."""

    def __init__(self, base: Any, start: int = 0, step: int = 1):
        self.base, self.start, self.step = base, start, step
        rows, cols = base.shape
        self.shape = (len(range(start, cols, step)), rows)

    def load(self, dtype: torch.dtype, rows=None, cols=None) -> torch.Tensor:
        t = self.base.load(dtype)[:, self.start :: self.step].t()
        if rows is not None:
            t = t[rows[0] : rows[0] + rows[1]]
        if cols is not None:
            t = t[:, cols[0] : cols[0] + cols[1]]
        return t.contiguous()


class _Every:
    """Entries start, start + step, ... of a 1-D lazy weight (an interleaved bias)."""

    def __init__(self, base: Any, start: int, step: int):
        self.base, self.start, self.step = base, start, step
        self.shape = (len(range(start, base.shape[0], step)),)

    def load(self, dtype: torch.dtype, rows=None, cols=None) -> torch.Tensor:
        return self.base.load(dtype)[self.start :: self.step].contiguous()


def _expert_parts(prefix: str, kind: str, weight: Any, e: int) -> list[tuple[str, Any]]:
    """Expert e's matrices (or biases, `kind` ending in _bias) of a packed tensor."""
    one = weight.expert(e)
    if kind == "down_proj_bias":
        return [(f"{prefix}{e}.down_proj.bias", one)]
    if kind == "gate_up_proj_bias":
        return [(f"{prefix}{e}.gate_proj.bias", _Every(one, 0, 2)),
                (f"{prefix}{e}.up_proj.bias", _Every(one, 1, 2))]  # fmt: skip
    blocks = getattr(weight, "out_by_in", False)  # MXFP4: rows are outputs already
    if kind == "down_proj":
        return [(f"{prefix}{e}.down_proj.weight", one if blocks else _Transposed(one))]
    gate, up = (one.every(0, 2), one.every(1, 2)) if blocks else (
        _Transposed(one, 0, 2), _Transposed(one, 1, 2))  # fmt: skip
    return [(f"{prefix}{e}.gate_proj.weight", gate), (f"{prefix}{e}.up_proj.weight", up)]


def _layout(weights: Iterable[tuple[str, Any]], config: ModelConfig) -> Iterator[tuple[str, Any]]:
    """gpt-oss's tensors as the shared loader reads them (see the module docstring): packed or
    MXFP4 experts (their halves joined by loader/hf_mxfp4.py) one matrix per expert and kind,
    biases likewise (GGUF's stacked ones too), the router as `mlp.gate`, GGUF's
    `attn_sinks.weight` as HF's `self_attn.sinks`."""
    for name, weight in weights:
        name = name.replace(".mlp.router.", ".mlp.gate.")
        if name.endswith(".self_attn.sinks.weight"):
            name = name.removesuffix(".weight")
        if m := _PACKED.match(name):
            prefix, kind = m.group(1), m.group(2) + (m.group(3) or "")
            for e in range(weight.shape[0]):
                yield from _expert_parts(prefix, kind, weight, e)
        elif (m := _STACKED_BIAS.match(name)) and len(weight.shape) == 2:
            for e in range(weight.shape[0]):  # GGUF: [experts, rows]
                yield f"{m.group(1)}{e}.{m.group(2)}.bias", weight.expert(e)
        else:
            yield name, weight


# ---- configs ---------------------------------------------------------------------------------
def _alternating(n: int) -> tuple[str, ...]:
    """HF's default and llama.cpp's rule: even layers slide, odd ones see everything."""
    return tuple(SLIDING_ATTENTION if i % 2 == 0 else FULL_ATTENTION for i in range(n))


def _experts(r, limit: float, alpha: float) -> MoEConfig:
    return MoEConfig(num_experts=r.int("num_local_experts"), top_k=r.int("num_experts_per_tok"),
                     intermediate_size=r.int("intermediate_size"), normalize_top_k=False,
                     biases=True, softmax_after_top_k=True, swiglu_limit=limit,
                     swiglu_alpha=alpha)  # fmt: skip


def _hf_fields(r) -> dict:
    biased = r.bool("attention_bias", True)  # gpt-oss's: on all four projections
    rope = r.rope(r.cfg.get("rope_parameters"), r.number("rope_theta", ROPE_THETA),
                  r.cfg.get("rope_scaling"), "rope_parameters")  # fmt: skip
    return dict(
        moe=_experts(r, r.number("swiglu_limit", SWIGLU_LIMIT),
                     r.number("swiglu_alpha", SWIGLU_ALPHA)),
        attention_bias=biased, output_bias=biased, rope=rope,
        layer_types=_alternating(r.int("num_hidden_layers")),
    )  # fmt: skip


def _gguf_fields(g) -> dict:
    """llama.cpp's converter stores neither the SwiGLU constants nor YaRN's `truncate`:
    gpt-oss's own (llama.cpp hard-codes them too)."""
    experts = dataclasses.replace(g.experts(normalize_top_k=False), biases=True,
                                  softmax_after_top_k=True, swiglu_limit=SWIGLU_LIMIT,
                                  swiglu_alpha=SWIGLU_ALPHA)  # fmt: skip
    out: dict[str, Any] = dict(moe=experts, layer_types=_alternating(g.num_layers),
                               output_bias=g.has_tensor("blk.0.attn_output.bias"))  # fmt: skip
    if g.meta("rope.scaling.type", None) == "yarn":
        theta = float(g.meta("rope.freq_base", ROPE_THETA))
        out["rope"] = RopeConfig(theta, {**g.yarn(), "truncate": False})
    return out


ARCHITECTURE = Architecture(
    name="gpt_oss",
    model_class=GptOssForCausalLM,
    hf_classes=("GptOssForCausalLM",),
    gguf_names=("gpt-oss",),
    moe=True,
    hf_fields=_hf_fields,
    hf_attention_bias=False,  # read by _hf_fields: biases on all four projections are its own
    gguf_fields=_gguf_fields,
    gguf_tensors={
        **GGUF_MOE_TENSORS,
        "post_attention_norm": "post_attention_layernorm",  # the norm before the MLP
        "attn_sinks": "self_attn.sinks",
    },
    tensor_layout=_layout,
    extra_layer_tensors=lambda c: {"self_attn.sinks": (c.num_heads,)},
    tool_call_format="harmony",
    c_decoder=False,
    tensor_parallel=False,
)

"""The CPU decoder: every decoder layer of every step of a model on GGUF blocks as one C call.

For one sequence a layer is ~45 small PyTorch ops and the Python around them, more than its
weights take to read; cpu_kernels/decode_layer.c computes the same layer in one call, for any
number of rows: decode rows, prefill chunks, mixed steps, speculative verification rows, prompt
logprob steps, recompute after preemption. One numeric path for all of them, each row's result
independent of the others (docs/performance.md). The contract, checked once at load
(`for_model`) and per step (`serves`):

* **What it needs from the model.** Every decoder layer spells itself out as a
  `DecoderLayerParts` (decoder_layer_parts.py): its norms, attention and MLP, and which of Gemma's
  sandwich norms it has. The four projections must hold GGUF blocks (`BlockMethod`, at most
  `MAX_PARTS` row ranges each), the activation must be one the kernel knows, and the model is
  not split across ranks.
* **Which steps it serves.** Any step whose attention backend is the `cpu` one in its
  fixed-order mode (the C layer attends with the same C kernel, reading the per-row plans of
  the step's metadata; the `torch` backend means pure PyTorch) and whose KV caches are float32,
  bfloat16 or int8 (quantised per token and KV head as the layer stores them:
  inferd/kv_int8.py) on the CPU. Any other step (an fp8 cache) takes the layers' own forward.

The layers' forward computes the same thing (tests/parity/test_fused_decode.py compares them
layer by layer). This module describes each layer to the kernel once (pointers into tensors
that live as long as the model) and, per step, the step's cache slots and rotary tables.
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from inferd.attention.backend import ForwardContext
from inferd.attention.cpu_backend import (
    C_CACHE_DTYPES,
    CACHE_FORMATS,
    CpuAttentionBackend,
    CpuAttentionMetadata,
)
from inferd.layers.block_method import BlockMethod
from inferd.layers.gguf_blocks import MAX_PARTS, BlockMatrix
from inferd.layers.linear import Linear
from inferd.layers.rotary import kernel_cos_sin
from inferd.models.decoder_layer_parts import DecoderLayerParts

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
LORA_MAX_PARTS = 4  # INFERD_LORA_MAX_PARTS in cpu_kernels/kernels.h
ACTIVATIONS = {"silu": 0, "gelu_pytorch_tanh": 1, "gelu_tanh": 1}


class BlockLinear(ctypes.Structure):
    _fields_ = [("count", _I), ("parts", BlockMatrix * MAX_PARTS)]


class LoraLinear(ctypes.Structure):
    """Mirrors LoraLinear in cpu_kernels/kernels.h: one projection's resident adapters."""

    _fields_ = [("slots", _I), ("in_features", _I), ("out_features", _I), ("rank", _I),
                ("parts", _I), ("cols", _I * (LORA_MAX_PARTS + 1)),
                ("a", _P), ("b", _P)]  # fmt: skip

    @classmethod
    def of(cls, w) -> LoraLinear:
        """From a LoRASlotWeights (layers/lora.py), whose tensors outlive the decoder."""
        cols = list(w.part_cols) + [w.part_cols[-1]] * (LORA_MAX_PARTS + 1 - len(w.part_cols))
        return cls(w.a.shape[0], w.in_features, w.out_features, w.rank, len(w.parts),
                   (_I * (LORA_MAX_PARTS + 1))(*cols), w.a.data_ptr(), w.b.data_ptr())  # fmt: skip


class LayerSpec(ctypes.Structure):
    """Mirrors LayerSpec in cpu_kernels/decode_layer.c."""

    _fields_ = [
        ("hidden", _I), ("heads", _I), ("kv_heads", _I), ("head_dim", _I), ("inter", _I),
        ("gelu", _I), ("sandwich", _I), ("window", _I), ("eps", _F), ("scale", _F),
        ("softcap", _F), ("residual", _F), ("qkv", BlockLinear), ("o", BlockLinear),
        ("gate_up", BlockLinear), ("down", BlockLinear), ("qkv_bias", _P), ("input_gain", _P),
        ("post_attn_gain", _P), ("pre_ffn_gain", _P), ("post_ffn_gain", _P), ("qk_gain", _P),
        ("lora_qkv", LoraLinear), ("lora_o", LoraLinear), ("lora_gate_up", LoraLinear),
        ("lora_down", LoraLinear),
    ]  # fmt: skip


class StepSpec(ctypes.Structure):
    """Mirrors StepSpec in cpu_kernels/decode_layer.c."""

    _fields_ = [("n", _I), ("cos", _P), ("sin", _P), ("k_pool", _P), ("v_pool", _P),
                ("cache_format", _I), ("slots", _P), ("keys", _P), ("adapter", _P)]  # fmt: skip


def _blocks_of(linear: Linear) -> BlockLinear | None:
    method = linear.quant_method
    if not isinstance(method, BlockMethod) or method.blocks is None:
        return None
    if method.input_order is not None:  # GPTQ act-order: the layer gathers its inputs first
        return None
    parts = method.blocks.parts
    if len(parts) > MAX_PARTS:
        return None
    return BlockLinear(len(parts), (BlockMatrix * MAX_PARTS)(*[p.struct for p in parts]))


def _gain(norm) -> torch.Tensor:
    return norm.float_gain().contiguous()


class _CLayer:
    """One decoder layer described to the kernel; `keep` holds the tensors it points into."""

    def __init__(self, parts: DecoderLayerParts, matrices: list[BlockLinear], hidden: int):
        attn, s = parts.attention, parts.attention.spec
        sandwich = parts.post_attention_norm is not None
        if sandwich != (parts.post_mlp_norm is not None):
            raise ValueError("the C layer takes both sandwich norms or neither")
        # C's post_attn_gain is the norm applied after attention: Gemma's post-attention norm,
        # or (no sandwich) the norm before the MLP; pre_ffn_gain is Gemma's pre-MLP norm.
        keep = {"input": _gain(parts.input_norm)}
        if sandwich:
            keep["post_attn"] = _gain(parts.post_attention_norm)
            keep["pre_ffn"] = _gain(parts.pre_mlp_norm)
            keep["post_ffn"] = _gain(parts.post_mlp_norm)
        else:
            keep["post_attn"] = _gain(parts.pre_mlp_norm)
        if attn.q_norm is not None:
            q, k = _gain(attn.q_norm), _gain(attn.k_norm)
            keep["qk"] = torch.cat([q.expand(s.num_heads, -1), k.expand(s.num_kv_heads, -1)])
        if attn.qkv_proj.bias is not None:
            keep["bias"] = attn.qkv_proj.bias.float().contiguous()
        self.keep = keep

        def ptr(name):
            return keep[name].data_ptr() if name in keep else None

        self.spec = LayerSpec(
            hidden, s.num_heads, s.num_kv_heads, s.head_dim, parts.mlp.down_proj.in_features,
            ACTIVATIONS[parts.activation], int(sandwich), s.window or 0,
            parts.input_norm.eps, s.scale, s.softcap or 0.0, parts.residual_multiplier,
            *matrices, ptr("bias"), ptr("input"), ptr("post_attn"), ptr("pre_ffn"),
            ptr("post_ffn"), ptr("qk"),
        )  # fmt: skip
        self.attention = s


class CpuDecoder:
    def __init__(self, layers: list[_CLayer], lib: ctypes.CDLL, inv_freqs: list[torch.Tensor],
                 rope_index: list[int], magnitudes: list[float] | None = None):  # fmt: skip
        """`inv_freqs`: the RoPE frequencies of each distinct RoPE config; `rope_index`: which
        one each layer uses; `magnitudes`: each config's cos/sin scale (YaRN's; default 1)."""
        self.layers, self.lib = layers, lib
        self.inv_freqs = [f.float().contiguous() for f in inv_freqs]
        self.magnitudes = magnitudes or [1.0] * len(inv_freqs)
        self.rope_index = rope_index
        self.lora = None  # the model's LoRASlots (layers/lora.py), once attached
        self._layer_pointers = None  # the layers' specs as the C call takes them (`run`)
        # True: `run` calls `run_layer` for each layer instead of one call for all, so that a
        # profile's trace has a range per layer (profiling/instrument.py sets it)
        self.layer_by_layer = False
        self._groups = [layer.attention.group for layer in layers]  # each layer's KV group
        self._pools_of = None  # (the caches list, `_pools` of it)
        self._caches_served = None  # (the caches list, whether the C layer takes its dtypes)

    def forget_kv_caches(self) -> None:
        """Drop what is kept about the runner's KV caches (the list, its pools' addresses): a
        sleep frees them (engine/core/sleep_mode.py), and a reference kept here would keep
        their memory too."""
        self._pools_of = self._caches_served = None

    @classmethod
    def for_model(cls, model: nn.Module) -> CpuDecoder | None:
        """The decoder for a loaded model (a CausalLM of base.py, which builds its decoder here
        and so is not imported), or None when the model does not meet the contract (see the
        module docstring)."""
        scheme = model.scheme
        if model.tp.enabled or scheme.kernels is None or not scheme.blocks:
            return None
        layers = []
        for layer in model.model.layers:
            parts: DecoderLayerParts = layer.parts()
            if parts.activation not in ACTIVATIONS:
                return None
            if not isinstance(getattr(parts.mlp, "gate_up_proj", None), Linear):
                return None  # a Mixture of Experts: the C layer has a dense gated MLP only
            attention = parts.attention
            if attention.spec.sinks is not None or attention.o_proj.bias is not None:
                return None  # gpt-oss's attention sinks and o_proj bias: not in the C layer
            linears = [parts.attention.qkv_proj, parts.attention.o_proj,
                       parts.mlp.gate_up_proj, parts.mlp.down_proj]  # fmt: skip
            matrices = [_blocks_of(lin) for lin in linears]
            if any(m is None for m in matrices):
                return None
            layers.append(_CLayer(parts, matrices, model.config.hidden_size))
        return cls(layers, scheme.kernels, [r.portable_inv_freq for r in model.rotaries],
                   model.rope_index, [r.magnitude for r in model.rotaries])  # fmt: skip

    def attach_lora(self, slots) -> None:
        """Compute the adapters of `slots` (a LoRASlots) beside each block product."""
        if any(len(w.parts) > LORA_MAX_PARTS for w in slots.weights.values()):
            raise ValueError(f"the C layer takes at most {LORA_MAX_PARTS} parts per projection")
        for index, layer in enumerate(self.layers):
            for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
                field = "lora_" + name.removesuffix("_proj")
                setattr(layer.spec, field, LoraLinear.of(slots.weights[(index, name)]))
        self.lora = slots

    def serves(self, ctx: ForwardContext) -> bool:
        backend = ctx.backend
        if not isinstance(backend, CpuAttentionBackend) or not backend.fixed_order:
            return False
        if not isinstance(ctx.metadata, CpuAttentionMetadata):
            return False
        caches = ctx.kv_caches
        if self._caches_served is None or self._caches_served[0] is not caches:  # once per list
            takes = all(c.dtype in C_CACHE_DTYPES and c.device.type == "cpu"
                        for group in caches for c in group)  # fmt: skip
            self._caches_served = (caches, takes)
        return self._caches_served[1]

    def run(self, h: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """The residual stream after every layer, for a step `serves` accepted: all layers in
        one C call (decode_layer.c, `inferd_decode_layers`)."""
        h = h.float().contiguous()
        tables = [kernel_cos_sin(self.lib, f, positions, m)
                  for f, m in zip(self.inv_freqs, self.magnitudes)]  # fmt: skip
        if self.layer_by_layer:
            for index, rope in enumerate(self.rope_index):
                self.run_layer(index, h, tables[rope], ctx)
            return h
        # NOTE: the StepSpecs from pointers gathered once per step (rotary tables, each KV
        # group's slots and key plans) and once per set of caches (each layer's pools): built
        # layer by layer (`_step`) they took ~5 us each, 18 a token.
        meta: CpuAttentionMetadata = ctx.metadata
        ropes = [(cos.data_ptr(), sin.data_ptr()) for cos, sin in tables]
        slots = [m.data_ptr() for m in meta.slot_mappings]
        keys = [ctypes.addressof(plan.struct) for plan in meta.rows]
        rows, adapter = h.shape[0], self._adapter_rows(h.shape[0])
        steps = [StepSpec(rows, *ropes[rope], *pools, slots[group], keys[group], adapter)
                 for rope, group, pools in zip(self.rope_index, self._groups,
                                               self._pools(ctx.kv_caches))]  # fmt: skip
        count = len(self.layers)
        if self._layer_pointers is None:  # the specs live as long as the decoder
            self._layer_pointers = (_P * count)(
                *[ctypes.addressof(layer.spec) for layer in self.layers]
            )
        pointers = (_P * count)(*[ctypes.addressof(step) for step in steps])
        rc = self.lib.inferd_decode_layers(count, self._layer_pointers, pointers, h.data_ptr())
        if rc != 0:
            raise RuntimeError(f"the C decoder layers failed ({rc})")
        return h

    def run_layer(self, index: int, h: torch.Tensor, rope, ctx: ForwardContext) -> None:
        """Layer `index` alone on the contiguous float32 residual stream `h`, in place (it also
        stores the step's keys and values in the layer's cache). `rope`: cos and signed sin,
        [rows, head_dim] (or [rows, 1, head_dim]) float32."""
        step = self._step(index, h.shape[0], rope, ctx, self._adapter_rows(h.shape[0]))
        rc = self.lib.inferd_decode_layer(ctypes.byref(self.layers[index].spec),
                                          ctypes.byref(step), h.data_ptr())  # fmt: skip
        if rc != 0:
            raise RuntimeError(f"the C decoder layer failed ({rc})")

    def _pools(self, kv_caches) -> list[tuple[int, int, int]]:
        """Each layer's (keys pool, values pool, cache format), kept while the step's caches
        are the same list (a runner allocates its caches once)."""
        if self._pools_of is None or self._pools_of[0] is not kv_caches:
            pools = []
            for layer in self.layers:
                s = layer.attention
                cache = kv_caches[s.group][s.index_in_group]
                pools.append((cache[0].data_ptr(), cache[1].data_ptr(),
                              CACHE_FORMATS[cache.dtype]))  # fmt: skip
            self._pools_of = (kv_caches, pools)
        return self._pools_of[1]

    def _step(self, index: int, rows: int, rope, ctx: ForwardContext,
              adapter: int | None) -> StepSpec:  # fmt: skip
        """The step as layer `index` sees it: its pools, its group's slots and key plans."""
        meta: CpuAttentionMetadata = ctx.metadata
        (cos, sin), group = rope, self._groups[index]
        return StepSpec(rows, cos.data_ptr(), sin.data_ptr(), *self._pools(ctx.kv_caches)[index],
                        meta.slot_mappings[group].data_ptr(),
                        ctypes.addressof(meta.rows[group].struct), adapter)  # fmt: skip

    def _adapter_rows(self, rows: int) -> int | None:
        """The step's per-row adapter slots for the kernel; None when no row has an adapter."""
        lora = self.lora
        if lora is None or not lora.groups:
            return None
        if lora.token_slots.shape[0] != rows:
            raise ValueError(f"the step has {rows} rows but {lora.token_slots.shape[0]} "
                             "adapter slots were prepared")  # fmt: skip
        return lora.token_slots.data_ptr()

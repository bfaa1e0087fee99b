"""A whole decoder layer of a decode step in one C call (`--quantization gguf` on CPU).

For one sequence a layer is ~45 small PyTorch ops and the Python around them, ~250 us, more than
its weights take to read; cpu_kernels/decode_layer.c does the same computation in one call. This
module describes each layer to that kernel once (pointers into its tensors, which stay alive as
long as the model) and, per step, the cache slots and rotary tables of the step.

It serves steps where every sequence has one new token, at most `KERNEL_MAX_ROWS` of them, with
a float32 KV cache and the PyTorch attention backend's plan; any other step (prefill, mixed
steps, tensor parallelism) takes the layers' ordinary forward, which computes the same thing
(tests/parity/test_fused_decode.py checks that they agree).
"""

from __future__ import annotations

import ctypes

import torch

from inferd.attention.backend import ForwardContext
from inferd.attention.torch_backend import _plan
from inferd.layers.gguf_blocks import KERNEL_MAX_ROWS, MAX_PARTS, BlockMatrix, BlockWeight

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
ACTIVATIONS = {"silu": 0, "gelu_pytorch_tanh": 1, "gelu_tanh": 1}


class BlockLinear(ctypes.Structure):
    _fields_ = [("count", _I), ("parts", BlockMatrix * MAX_PARTS)]


class LayerSpec(ctypes.Structure):
    _fields_ = [
        ("hidden", _I), ("heads", _I), ("kv_heads", _I), ("head_dim", _I), ("inter", _I),
        ("gelu", _I), ("sandwich", _I), ("window", _I), ("eps", _F), ("scale", _F),
        ("softcap", _F), ("qkv", BlockLinear), ("o", BlockLinear), ("gate_up", BlockLinear),
        ("down", BlockLinear), ("qkv_bias", _P), ("input_gain", _P), ("post_attn_gain", _P),
        ("pre_ffn_gain", _P), ("post_ffn_gain", _P), ("qk_gain", _P),
    ]  # fmt: skip


class StepSpec(ctypes.Structure):
    _fields_ = [
        ("n", _I), ("cos", _P), ("sin", _P), ("k_pool", _P), ("v_pool", _P),
        ("block_size", _I), ("slots", _P), ("blocks", _P), ("starts", _P), ("lens", _P),
        ("width", _I),
    ]  # fmt: skip


def _matrix(linear) -> BlockLinear:
    parts = linear.small_step.parts
    return BlockLinear(len(parts), (BlockMatrix * MAX_PARTS)(*[p.struct for p in parts]))


def _gain(norm) -> torch.Tensor:
    return norm.float_gain().contiguous()


class FusedDecodeLayer:
    def __init__(self, layer, config, lib):
        attn, mlp = layer.self_attn, layer.mlp
        s = attn.spec
        sandwich = hasattr(layer, "pre_feedforward_layernorm")
        keep = {  # tensors the C side points into
            "input": _gain(layer.input_layernorm),
            "post_attn": _gain(layer.post_attention_layernorm),
        }
        if sandwich:
            keep["pre_ffn"] = _gain(layer.pre_feedforward_layernorm)
            keep["post_ffn"] = _gain(layer.post_feedforward_layernorm)
        if attn.q_norm is not None:
            q, k = _gain(attn.q_norm), _gain(attn.k_norm)
            keep["qk"] = torch.cat([q.expand(s.num_heads, -1), k.expand(s.num_kv_heads, -1)])
        bias = attn.qkv_proj.bias
        if bias is not None:
            keep["bias"] = bias.float().contiguous()
        self._keep = keep

        def ptr(name):
            return keep[name].data_ptr() if name in keep else None

        self.spec = LayerSpec(
            config.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim,
            mlp.down_proj.in_features, ACTIVATIONS[config.hidden_act], int(sandwich),
            s.window or 0, layer.input_layernorm.eps, s.scale, s.softcap or 0.0,
            _matrix(attn.qkv_proj), _matrix(attn.o_proj), _matrix(mlp.gate_up_proj),
            _matrix(mlp.down_proj), ptr("bias"), ptr("input"), ptr("post_attn"), ptr("pre_ffn"),
            ptr("post_ffn"), ptr("qk"),
        )  # fmt: skip
        self.attention = s
        self.lib = lib

    def __call__(self, h: torch.Tensor, rope, ctx: ForwardContext) -> torch.Tensor | None:
        """The layer's output, computed in C; None when this step is not one it serves."""
        s = self.attention
        n = h.shape[0]
        if n > KERNEL_MAX_ROWS or ctx.backend.name != "torch":
            return None
        cache = ctx.kv_caches[s.group][s.index_in_group]
        if cache.dtype != torch.float32:
            return None
        g = ctx.meta.groups[s.group]
        plan = g.cache.get("torch")
        if plan is None:
            plan = g.cache["torch"] = _plan(ctx.meta, g)
        decode, chunks = plan
        if decode is None or decode.token_idx is not None or chunks:
            return None
        h = h.float().contiguous()
        cos, sin = rope
        step = StepSpec(
            n, cos.data_ptr(), sin.data_ptr(), cache[0].data_ptr(), cache[1].data_ptr(),
            cache.shape[2], g.slot_mapping.data_ptr(), decode.blocks.data_ptr(),
            decode.starts.data_ptr(), decode.lens.data_ptr(), decode.width,
        )  # fmt: skip
        rc = self.lib.inferd_decode_layer(ctypes.byref(self.spec), ctypes.byref(step),
                                          h.data_ptr())  # fmt: skip
        if rc != 0:
            raise RuntimeError(f"fused decode layer failed ({rc})")
        return h


def attach_fused_decode(model) -> int:
    """Give each layer a `fused` decode path where the kernel covers it (all four projections
    block-quantised, a supported activation, no tensor parallelism). Returns how many."""
    from inferd.cpu_kernels import kernel_library

    config = model.config
    if model.tp.enabled or config.hidden_act not in ACTIVATIONS:
        return 0
    lib = kernel_library()
    count = 0
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears = [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]
        if all(isinstance(lin.small_step, BlockWeight) and len(lin.small_step.parts) <= MAX_PARTS
               for lin in linears):  # fmt: skip
            layer.fused = FusedDecodeLayer(layer, config, lib)
            count += 1
    return count

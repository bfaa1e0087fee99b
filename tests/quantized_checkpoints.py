"""Pre-quantised HF checkpoints written from a tiny HF model, as AutoAWQ, GPTQ tools and
llm-compressor lay them out (AWQ's GEMM packing, GPTQ's packing and its zero-minus-one, the
compressed-tensors names), plus the dequantised weights, which the tests load back into the HF
model as the reference: parity then checks inferd's reading, packing and kernels, not a
quantiser.

The quantiser here is plain round-to-nearest on each group's range (which weights get which
integers does not matter to the checks; that the file and the reference agree does)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble k of a word holds output AWQ_ORDER[k]


def _pack(values: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Unsigned values packed 32 / bits to an int32 word along `dim`, value j at bits * j."""
    v = values.to(torch.int64).movedim(dim, -1)
    per = 32 // bits
    v = v.reshape(*v.shape[:-1], -1, per)
    words = (v << (torch.arange(per) * bits)).sum(-1)
    return torch.from_numpy(words.numpy().astype(np.uint32).view(np.int32)).movedim(-1, dim)


def _asym(w: torch.Tensor, bits: int):
    """[rows, groups, g] → (q, zero [rows, groups], fp16-exact scale [rows, groups])."""
    top = (1 << bits) - 1
    lo, hi = w.amin(-1).clamp(max=0), w.amax(-1).clamp(min=0)
    scale = ((hi - lo) / top).clamp(min=1e-6).half().float()
    zero = (-lo / scale).round().clamp(0, top)
    q = (w / scale[..., None] + zero[..., None]).round().clamp(0, top)
    return q, zero, scale


def _sym(w: torch.Tensor, bits: int):
    """Symmetric: zero at the middle of the range, scale from the absolute maximum."""
    mid = 1 << (bits - 1)
    scale = (w.abs().amax(-1) / (mid - 1)).clamp(min=1e-6).half().float()
    q = (w / scale[..., None]).round().clamp(-mid, mid - 1) + mid
    return q, torch.full_like(scale, mid), scale


def awq_layer(w: torch.Tensor, group: int):
    """AWQ GEMM tensors of w [out, in] and its dequantised weight."""
    out, k = w.shape
    q, zero, scale = _asym(w.reshape(out, k // group, group), 4)
    deq = ((q - zero[..., None]) * scale[..., None]).reshape(out, k)
    order = [c * 8 + AWQ_ORDER[j] for c in range(out // 8) for j in range(8)]
    tensors = {
        "qweight": _pack(q.reshape(out, k).t()[:, order], 4, 1),
        "qzeros": _pack(zero.t()[:, order], 4, 1),
        "scales": scale.t().half().contiguous(),
    }
    return tensors, deq


def awq_config(group: int) -> dict:
    """config.json's quantization_config of an AutoAWQ GEMM checkpoint."""
    return {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
            "version": "gemm"}  # fmt: skip


def gptq_layer(w: torch.Tensor, bits: int, group: int, sym: bool, act_order: bool, seed: int):
    """GPTQ (v1: zeros stored minus one) tensors of w [out, in] and its dequantised weight;
    with `act_order`, each input's group follows a random permutation (`g_idx`)."""
    out, k = w.shape
    perm = torch.randperm(k, generator=torch.Generator().manual_seed(seed)) if act_order \
        else torch.arange(k)  # fmt: skip
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[perm] = (torch.arange(k) // group).to(torch.int32)
    grouped = w[:, perm].reshape(out, k // group, group)
    q, zero, scale = (_sym if sym else _asym)(grouped, bits)
    deq_sorted = ((q - zero[..., None]) * scale[..., None]).reshape(out, k)
    deq = torch.empty_like(deq_sorted)
    deq[:, perm] = deq_sorted
    q_in_order = torch.empty(out, k)
    q_in_order[:, perm] = q.reshape(out, k)
    tensors = {
        "qweight": _pack(q_in_order.t(), bits, 0),
        "qzeros": _pack((zero - 1).t(), bits, 1),
        "scales": scale.t().half().contiguous(),
        "g_idx": g_idx,
    }
    return tensors, deq


def int8_layer(w: torch.Tensor, group: int | None):
    """compressed-tensors INT8, symmetric, per channel (group None) or per group."""
    out, k = w.shape
    g = group or k
    blocks = w.reshape(out, k // g, g)
    scale = (blocks.abs().amax(-1) / 127).clamp(min=1e-6)
    q = (blocks / scale[..., None]).round().clamp(-128, 127)
    deq = (q * scale[..., None]).reshape(out, k)
    return {"weight": q.reshape(out, k).to(torch.int8), "weight_scale": scale}, deq


def fp8_layer(w: torch.Tensor, per_channel: bool, input_scale: float | None):
    """compressed-tensors FP8 e4m3 with a per-channel [out, 1] or per-tensor [1] scale."""
    amax = w.abs().amax(1, keepdim=True) if per_channel else w.abs().amax().reshape(1)
    scale = (amax / 448.0).clamp(min=1e-9)
    codes = (w / (scale if per_channel else scale[0])).to(torch.float8_e4m3fn)
    deq = codes.float() * (scale if per_channel else scale[0])
    tensors = {"weight": codes, "weight_scale": scale.float()}
    if input_scale is not None:
        tensors["input_scale"] = torch.tensor([input_scale])
    return tensors, deq


def compressed_config(weights: dict, activations: dict | None, fmt: str) -> dict:
    return {"quant_method": "compressed-tensors", "format": fmt, "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": activations}}}  # fmt: skip


def write_quantized(model, folder: Path, quantize, quantization_config: dict) -> None:
    """save_pretrained `model`, then replace each decoder linear weight by `quantize(name, w)`'s
    tensors, write `quantization_config`, and load the dequantised weights into `model`."""
    model.save_pretrained(folder, safe_serialization=True)
    (file,) = folder.glob("*.safetensors")
    state = load_file(str(file))
    for i, layer in enumerate(model.model.layers):
        for sub in ("self_attn", "mlp"):
            for name, lin in getattr(layer, sub).named_children():
                if name not in LINEARS:
                    continue
                key = f"model.layers.{i}.{sub}.{name}"
                tensors, deq = quantize(key, lin.weight.detach().float())
                del state[f"{key}.weight"]
                state.update({f"{key}.{t}": v.contiguous() for t, v in tensors.items()})
                with torch.no_grad():
                    lin.weight.copy_(deq)
    save_file(state, str(file), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (folder / "config.json").write_text(json.dumps(config))

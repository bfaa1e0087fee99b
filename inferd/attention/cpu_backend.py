"""The `cpu` attention backend: the torch backend's plans and prefill, with decode attention in
C (cpu_kernels/decode_attention.c) reading float32 or bfloat16 caches in place.

The torch backend gathers every decode sequence's context blocks into a padded tensor and masks
it; the C kernel walks the same blocks where they lie, splits one sequence's keys across the
cores and merges them with the online softmax, with products in float32. It is checked against
the torch backend (tests/unit/test_cpu_attention.py) and is what `auto` picks on CPU when the
kernels are available. Caches of other dtypes (fp8) take the torch path.
"""

from __future__ import annotations

import ctypes

import torch

from inferd.attention.backend import LayerAttentionSpec
from inferd.attention.torch_backend import DecodePlan, TorchAttentionBackend

C_CACHE_DTYPES = (torch.float32, torch.bfloat16)


def decode_in_c(lib: ctypes.CDLL, q: torch.Tensor, kv_cache: torch.Tensor, plan: DecodePlan,
                spec: LayerAttentionSpec) -> torch.Tensor:  # fmt: skip
    """Decode attention read straight from the pool: no gather, one call per layer, float32."""
    n = q.shape[0]
    q = q.float().contiguous()
    out = torch.empty(n, spec.num_heads, spec.head_dim)
    blocks = plan.blocks.view(n, plan.width)
    rc = lib.inferd_decode_attention(
        q.data_ptr(), kv_cache[0].data_ptr(), kv_cache[1].data_ptr(), blocks.data_ptr(),
        plan.starts.data_ptr(), plan.lens.data_ptr(), n, plan.width, kv_cache.shape[2],
        spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.scale, spec.window or 0,
        spec.softcap or 0.0, int(kv_cache.dtype == torch.bfloat16), out.data_ptr(),
    )  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"decode attention kernel failed ({rc}) for {spec}")
    return out


class CpuAttentionBackend(TorchAttentionBackend):
    """`lib`: the loaded C kernels (`inferd.cpu_kernels.kernel_library()`)."""

    name = "cpu"

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib

    def decode_attention(self, q: torch.Tensor, kv_cache: torch.Tensor, plan: DecodePlan,
                         spec: LayerAttentionSpec) -> torch.Tensor:  # fmt: skip
        if kv_cache.device.type != "cpu" or kv_cache.dtype not in C_CACHE_DTYPES:
            return super().decode_attention(q, kv_cache, plan, spec)
        return decode_in_c(self.lib, q, kv_cache, plan, spec)

"""Write the new tokens' keys and values into their paged cache slots.

One program per token copies its [kv_heads, head_dim] rows of K and of V. A slot is a position in
the flattened pool: block `slot // block_size`, row `slot % block_size`. Negative slots mark
padding tokens (e.g. a CUDA-graph batch padded up to a captured size) and are skipped. An int8
cache (inferd/kv_int8.py) gets each row quantised: its codes, then its float32 scale's 4 bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inferd.attention.triton_kernels.common import downcast, int8_quantize, interpreted


@triton.jit
def _store_int8(cache_ptr, dst, row_start, x, mask, head_ok, HEAD_DIM: tl.constexpr, stride_cd):
    """Rows x [heads, HEAD_PAD] as int8 codes at `dst`, each row's scale in the 4 bytes after
    its codes (from `row_start`, per head), little-endian."""
    codes, scale = int8_quantize(x.to(tl.float32))
    tl.store(cache_ptr + dst, codes, mask=mask)
    bits = scale.to(tl.uint32, bitcast=True)
    for i in tl.static_range(4):
        byte = ((bits >> (8 * i)) & 0xFF).to(tl.uint8).to(tl.int8, bitcast=True)
        tl.store(cache_ptr + row_start + (HEAD_DIM + i) * stride_cd, byte, mask=head_ok)


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_cb,  # cache strides: block, row in block, head, dim (shared by K and V)
    stride_cs,
    stride_ch,
    stride_cd,
    KV_HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    INT8: tl.constexpr,  # an int8 cache: quantised rows with their scales
    INTERPRETED: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot < 0:
        return
    heads = tl.arange(0, HEADS_PAD)
    h = heads[:, None]
    d = tl.arange(0, HEAD_PAD)[None, :]
    mask = (h < KV_HEADS) & (d < HEAD_DIM)
    row = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs + heads * stride_ch
    dst = row[:, None] + d * stride_cd
    k = tl.load(k_ptr + tok * stride_kt + h * stride_kh + d * stride_kd, mask=mask, other=0.0)
    v = tl.load(v_ptr + tok * stride_vt + h * stride_vh + d * stride_vd, mask=mask, other=0.0)
    if INT8:
        head_ok = heads < KV_HEADS
        _store_int8(k_cache_ptr, dst, row, k, mask, head_ok, HEAD_DIM, stride_cd)
        _store_int8(v_cache_ptr, dst, row, v, mask, head_ok, HEAD_DIM, stride_cd)
        return
    # The cache may be narrower than the activations (bf16 cache, fp32 model): store casts.
    tl.store(k_cache_ptr + dst, downcast(k, k_cache_ptr.dtype.element_ty, INTERPRETED), mask=mask)
    tl.store(v_cache_ptr + dst, downcast(v, v_cache_ptr.dtype.element_ty, INTERPRETED), mask=mask)


def store_kv(
    k: torch.Tensor,  # [tokens, kv_heads, head_dim]
    v: torch.Tensor,
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, kv_heads, width]
    slot_mapping: torch.Tensor,  # [tokens] int64
) -> None:
    """width: head_dim, or head_dim + 4 for an int8 cache (inferd/kv_int8.py)."""
    tokens, kv_heads, head_dim = k.shape
    if tokens == 0:
        return
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    _store_kv_kernel[(tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        *k.stride(),
        *v.stride(),
        *k_cache.stride(),
        KV_HEADS=kv_heads,
        HEADS_PAD=triton.next_power_of_2(kv_heads),
        HEAD_DIM=head_dim,
        HEAD_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=kv_cache.shape[2],
        INT8=kv_cache.dtype == torch.int8,
        INTERPRETED=interpreted(_store_kv_kernel),
    )

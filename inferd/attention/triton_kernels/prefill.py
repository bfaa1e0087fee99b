"""Paged prefill attention: the new tokens of several sequences, flattened, attend causally to
their sequence's context (previous chunks in the cache + this chunk, already stored there).

Grid: (work items, KV heads). A work item is (sequence, first query token of a tile) from a
list the host builds once per step; a program computes `block_q` query tokens × all the query
heads that share its KV head, so every K/V tile it reads from the cache serves the whole group
(GQA/MQA cost one cache read per KV head, not per query head). Rows are ordered token-major:
row r is token r // group_pad, head r % group_pad of the group.

Keys are visited in tiles of `block_n` positions with an online softmax (running max and sum,
rescaling the accumulator when the max grows). Each key position is translated through the
block table on its own, so tiles need not align with cache blocks and any block size works.

NOTE: the tile only reads keys in [lo, hi): hi is one past the last query position of the tile
and lo the first key inside the window of its first query. Every key in that range is visible
to at least one row of the tile, so it was written and its block is still in the table; slots
outside it (never written, or dropped from a sliding window to the null block) are never loaded.
Per-row causality and window limits are then applied to the scores. Attention sinks (gpt-oss:
one logit per query head) join each row's running max and sum after the last key tile.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inferd.attention.triton_kernels.common import (
    Tiles,
    dot_operand,
    downcast,
    int8_row_scale,
    interpreted,
    log2_scores,
    mma,
    with_sinks,
)


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    work_ptr,  # [items, 2] int32: (sequence, first query token of the tile)
    query_start_ptr,
    seq_lens_ptr,
    block_tables_ptr,
    sinks_ptr,  # [heads] float32 (HAS_SINKS only)
    stride_qt,
    stride_qh,
    stride_qd,
    stride_ot,
    stride_oh,
    stride_od,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_cd,
    stride_bt,
    scale,
    softcap,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    WINDOW: tl.constexpr,  # 0 = full attention
    HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    INT8: tl.constexpr,  # an int8 cache: codes x each row's scale (inferd/kv_int8.py)
    INTERPRETED: tl.constexpr,
    IEEE: tl.constexpr,
):
    item = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.load(work_ptr + 2 * item)
    q0 = tl.load(work_ptr + 2 * item + 1)
    q_start = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_start
    context = tl.load(seq_lens_ptr + seq) - q_len  # tokens cached before this chunk

    rows = tl.arange(0, BLOCK_Q * GROUP_PAD)
    tok = q0 + rows // GROUP_PAD
    head = kv_head * GROUP + rows % GROUP_PAD
    row_ok = (tok < q_len) & (rows % GROUP_PAD < GROUP)
    pos = context + tok
    d = tl.arange(0, HEAD_PAD)
    dmask = d < HEAD_DIM
    q_off = (q_start + tok).to(tl.int64) * stride_qt + head * stride_qh
    q = tl.load(
        q_ptr + q_off[:, None] + d[None, :] * stride_qd,
        mask=row_ok[:, None] & dmask[None, :],
        other=0.0,
    )
    q = dot_operand(q, INTERPRETED)

    hi = context + tl.minimum(q0 + BLOCK_Q, q_len)
    lo = 0
    if WINDOW > 0:
        lo = tl.maximum(context + q0 - WINDOW + 1, 0)

    # A finite floor instead of -inf: a row may see no key of a tile (window, padding), and
    # exp2(-inf - -inf) would be NaN.
    m = tl.full([BLOCK_Q * GROUP_PAD], -1.0e30, dtype=tl.float32)
    l_sum = tl.zeros([BLOCK_Q * GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_PAD, HEAD_PAD], dtype=tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    head_off = kv_head * stride_ch
    for n0 in range(lo, hi, BLOCK_N):
        key = n0 + tl.arange(0, BLOCK_N)
        key_ok = key < hi
        block = tl.load(table + key // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)
        kv_off = block * stride_cb + (key % BLOCK_SIZE) * stride_cs + head_off
        if INT8 and HEAD_DIM % 4 == 0:  # rows of head_dim + 4 bytes: each starts 4-aligned
            kv_off = tl.multiple_of(kv_off, 4)
        # K is loaded transposed, [head_dim, keys], ready for q @ k.
        k = tl.load(
            k_cache_ptr + kv_off[None, :] + d[:, None] * stride_cd,
            mask=key_ok[None, :] & dmask[:, None],
            other=0.0,
        )
        if INT8:  # the codes are the operand (exact in any float dtype); scaled after the dot
            k = k.to(tl.float32)
        k = dot_operand(downcast(k, q_ptr.dtype.element_ty, INTERPRETED), INTERPRETED)
        qk = mma(q, k, IEEE)
        if INT8:
            qk = qk * int8_row_scale(k_cache_ptr, kv_off, HEAD_DIM, stride_cd, key_ok)[None, :]
        s = log2_scores(qk, scale, softcap, HAS_SOFTCAP)
        visible = (key[None, :] <= pos[:, None]) & key_ok[None, :]
        if WINDOW > 0:
            visible = visible & (pos[:, None] - key[None, :] < WINDOW)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_sum = l_sum * alpha + tl.sum(p, 1)
        v = tl.load(
            v_cache_ptr + kv_off[:, None] + d[None, :] * stride_cd,
            mask=key_ok[:, None] & dmask[None, :],
            other=0.0,
        )
        if INT8:  # each key's value scale folded into its probability column instead
            p = p * int8_row_scale(v_cache_ptr, kv_off, HEAD_DIM, stride_cd, key_ok)[None, :]
            v = v.to(tl.float32)
        # Probabilities are rounded to the query dtype before the product, as the reference does.
        p = dot_operand(downcast(p, q_ptr.dtype.element_ty, INTERPRETED), INTERPRETED)
        v = dot_operand(downcast(v, q_ptr.dtype.element_ty, INTERPRETED), INTERPRETED)
        acc = acc * alpha[:, None] + mma(p, v, IEEE)
        m = m_new

    if HAS_SINKS:
        acc, l_sum = with_sinks(acc, m, l_sum, sinks_ptr, head, row_ok)
    out = acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None]
    o_off = (q_start + tok).to(tl.int64) * stride_ot + head * stride_oh
    tl.store(
        out_ptr + o_off[:, None] + d[None, :] * stride_od,
        downcast(out, out_ptr.dtype.element_ty, INTERPRETED),
        mask=row_ok[:, None] & dmask[None, :],
    )


def paged_prefill(
    q: torch.Tensor,  # [tokens, heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, kv_heads, head_dim (+ 4: int8)]
    out: torch.Tensor,  # [tokens, heads, head_dim]; only the work items' rows are written
    work: torch.Tensor,  # [items, 2] int32 (sequence, first query token)
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    tiles: Tiles,
    scale: float,
    window: int | None,
    softcap: float | None,
    sinks: torch.Tensor | None = None,  # [heads] float32
) -> None:
    kv_heads, head_dim = kv_cache.shape[3], q.shape[2]
    if work.shape[0] == 0:
        return
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    _prefill_kernel[(work.shape[0], kv_heads)](
        q,
        k_cache,
        v_cache,
        out,
        work,
        query_start_loc,
        seq_lens,
        block_tables,
        sinks if sinks is not None else seq_lens,  # a placeholder, never read
        *q.stride(),
        *out.stride(),
        *k_cache.stride(),
        block_tables.stride(0),
        scale,
        softcap or 0.0,
        GROUP=q.shape[1] // kv_heads,
        GROUP_PAD=tiles.group_pad,
        HEAD_DIM=head_dim,
        HEAD_PAD=tiles.head_pad,
        BLOCK_Q=tiles.block_q,
        BLOCK_N=tiles.block_n,
        BLOCK_SIZE=kv_cache.shape[2],
        WINDOW=window or 0,
        HAS_SOFTCAP=softcap is not None,
        HAS_SINKS=sinks is not None,
        INT8=kv_cache.dtype == torch.int8,
        INTERPRETED=interpreted(_prefill_kernel),
        IEEE=q.dtype == torch.float32,
        num_warps=tiles.num_warps,
    )

"""Paged decode attention: one new query token per sequence, split along the context
(flash-decoding).

A decode step has little parallelism per sequence: one token × the query heads of a KV head.
With few sequences (or one KV head, as in Gemma 3) the grid would be a handful of programs each
walking thousands of keys, so the context is also cut into up to `num_parts` partitions:

* `_decode_kernel`, grid (sequences, KV heads, partitions): each program attends the group's
  query heads (padded to 16 rows, the smallest tl.dot side) to its slice of keys and, when
  split, writes its unnormalised result with its running max and sum to scratch buffers;
* `_reduce_kernel`, grid (sequences, query heads): rescales every partition's result to the
  common max, m = max_p m_p, and divides:  out = Σ_p 2^(m_p - m) acc_p / Σ_p 2^(m_p - m) l_p.

Attention sinks (gpt-oss: a logit per query head) join the sum once per row: in the reduce
(m also over the sink), or unsplit, after the program's last key tile.

A sequence's visible span [lo, seq_len) (lo > 0 only behind a sliding window) is cut into
partitions of max(span / num_parts, min_part) keys, rounded to the key tile: short contexts use
fewer partitions than the grid offers and the spare programs return at once. The grid depends
only on the batch, so a CUDA-graph runner can fix `num_parts` per captured batch size.

NOTE: every key in [lo, seq_len) is visible to the query, hence written and still in the block
table; loads are masked to that range, so nothing else in the pool is ever read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inferd.attention.triton_kernels.common import (
    LOG2E,
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
def _partition(seq_len, WINDOW: tl.constexpr, NUM_PARTS: tl.constexpr, MIN_PART, BLOCK_N):
    """(first visible key, keys per partition) of a sequence; the reduce recomputes them."""
    if WINDOW > 0:
        lo = tl.maximum(seq_len - WINDOW, 0)
    else:
        lo = seq_len * 0
    size = tl.maximum(tl.cdiv(seq_len - lo, NUM_PARTS), MIN_PART)
    return lo, tl.cdiv(size, BLOCK_N) * BLOCK_N


@triton.jit
def _decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    part_acc_ptr,  # [sequences, heads, NUM_PARTS, HEAD_PAD] float32 (split only)
    part_ml_ptr,  # [sequences, heads, NUM_PARTS, 2] float32: running max (log2), sum
    seq_ids_ptr,  # [sequences] int32: which metadata row (mixed steps only)
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
    min_part,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    WINDOW: tl.constexpr,
    NUM_PARTS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    INDIRECT: tl.constexpr,
    INT8: tl.constexpr,  # an int8 cache: codes x each row's scale (inferd/kv_int8.py)
    INTERPRETED: tl.constexpr,
    IEEE: tl.constexpr,
):
    i = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    seq = i
    if INDIRECT:
        seq = tl.load(seq_ids_ptr + i)
    seq_len = tl.load(seq_lens_ptr + seq)
    lo, size = _partition(seq_len, WINDOW, NUM_PARTS, min_part, BLOCK_N)
    start = lo + part * size
    if start >= seq_len:  # a short context needs fewer partitions than the grid has
        return
    end = tl.minimum(start + size, seq_len)
    tok = tl.load(query_start_ptr + seq).to(tl.int64)
    g = tl.arange(0, GROUP_PAD)
    head = kv_head * GROUP + g
    d = tl.arange(0, HEAD_PAD)
    dmask = d < HEAD_DIM
    qmask = (g < GROUP)[:, None] & dmask[None, :]
    q_off = tok * stride_qt + head * stride_qh
    q = tl.load(q_ptr + q_off[:, None] + d[None, :] * stride_qd, mask=qmask, other=0.0)
    q = dot_operand(q, INTERPRETED)

    # Every tile holds at least one visible key, so the max is finite after the first.
    m = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_sum = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_PAD], dtype=tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    head_off = kv_head * stride_ch
    for n0 in range(start, end, BLOCK_N):
        key = n0 + tl.arange(0, BLOCK_N)
        key_ok = key < end
        block = tl.load(table + key // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)
        kv_off = block * stride_cb + (key % BLOCK_SIZE) * stride_cs + head_off
        if INT8 and HEAD_DIM % 4 == 0:  # rows of head_dim + 4 bytes: each starts 4-aligned
            kv_off = tl.multiple_of(kv_off, 4)
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
        s = tl.where(key_ok[None, :], s, float("-inf"))
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
        p = dot_operand(downcast(p, q_ptr.dtype.element_ty, INTERPRETED), INTERPRETED)
        v = dot_operand(downcast(v, q_ptr.dtype.element_ty, INTERPRETED), INTERPRETED)
        acc = acc * alpha[:, None] + mma(p, v, IEEE)
        m = m_new

    if NUM_PARTS == 1:
        if HAS_SINKS:
            acc, l_sum = with_sinks(acc, m, l_sum, sinks_ptr, head, g < GROUP)
        o_off = tok * stride_ot + head * stride_oh
        out = acc / l_sum[:, None]
        tl.store(
            out_ptr + o_off[:, None] + d[None, :] * stride_od,
            downcast(out, out_ptr.dtype.element_ty, INTERPRETED),
            mask=qmask,
        )
    else:
        row = (i * NUM_HEADS + head).to(tl.int64) * NUM_PARTS + part
        tl.store(part_acc_ptr + row[:, None] * HEAD_PAD + d[None, :], acc, mask=qmask)
        gmask = g < GROUP
        tl.store(part_ml_ptr + row * 2, m, mask=gmask)
        tl.store(part_ml_ptr + row * 2 + 1, l_sum, mask=gmask)


@triton.jit
def _reduce_kernel(
    out_ptr,
    part_acc_ptr,
    part_ml_ptr,
    seq_ids_ptr,
    query_start_ptr,
    seq_lens_ptr,
    sinks_ptr,
    stride_ot,
    stride_oh,
    stride_od,
    min_part,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WINDOW: tl.constexpr,
    NUM_PARTS: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    INDIRECT: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    i = tl.program_id(0)
    head = tl.program_id(1)
    seq = i
    if INDIRECT:
        seq = tl.load(seq_ids_ptr + i)
    seq_len = tl.load(seq_lens_ptr + seq)
    lo, size = _partition(seq_len, WINDOW, NUM_PARTS, min_part, BLOCK_N)
    part = tl.arange(0, NUM_PARTS)
    # Partitions past the end were never written: mask them out of every load.
    used = lo + part * size < seq_len
    row = (i * NUM_HEADS + head).to(tl.int64) * NUM_PARTS + part
    m = tl.load(part_ml_ptr + row * 2, mask=used, other=float("-inf"))
    l_sum = tl.load(part_ml_ptr + row * 2 + 1, mask=used, other=0.0)
    top = tl.max(m, 0)
    extra = 0.0  # what the sink adds to the sum (none without one)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head).to(tl.float32) * LOG2E
        top = tl.maximum(top, sink)
        extra = tl.exp2(sink - top)
    weight = tl.where(used, tl.exp2(m - top), 0.0)
    d = tl.arange(0, HEAD_PAD)
    dmask = d < HEAD_DIM
    acc = tl.load(
        part_acc_ptr + row[:, None] * HEAD_PAD + d[None, :],
        mask=used[:, None] & dmask[None, :],
        other=0.0,
    )
    out = tl.sum(acc * weight[:, None], 0) / (tl.sum(l_sum * weight, 0) + extra)
    tok = tl.load(query_start_ptr + seq).to(tl.int64)
    tl.store(
        out_ptr + tok * stride_ot + head * stride_oh + d * stride_od,
        downcast(out, out_ptr.dtype.element_ty, INTERPRETED),
        mask=dmask,
    )


def paged_decode(
    q: torch.Tensor,  # [tokens, heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, kv_heads, head_dim (+ 4: int8)]
    out: torch.Tensor,  # [tokens, heads, head_dim]; only the decode tokens' rows are written
    seq_ids: torch.Tensor | None,  # [n] int32 metadata rows of the decode sequences; None = all
    num_seqs: int,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    tiles: Tiles,
    scale: float,
    window: int | None,
    softcap: float | None,
    num_parts: int,  # power of two
    min_part: int,
    sinks: torch.Tensor | None = None,  # [heads] float32
) -> None:
    if num_seqs == 0:
        return
    heads, kv_heads, head_dim = q.shape[1], kv_cache.shape[3], q.shape[2]
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    if num_parts > 1:
        part_acc = q.new_empty((num_seqs, heads, num_parts, tiles.head_pad), dtype=torch.float32)
        part_ml = q.new_empty((num_seqs, heads, num_parts, 2), dtype=torch.float32)
    else:  # the kernel writes `out` directly; the scratch arguments are never touched
        part_acc = part_ml = out
    indirect = seq_ids is not None
    seq_ids = seq_ids if indirect else query_start_loc  # placeholder, never read
    common = dict(
        NUM_HEADS=heads,
        HEAD_DIM=head_dim,
        HEAD_PAD=tiles.head_pad,
        BLOCK_N=tiles.block_n,
        WINDOW=window or 0,
        NUM_PARTS=num_parts,
        HAS_SINKS=sinks is not None,
        INDIRECT=indirect,
        INTERPRETED=interpreted(_decode_kernel),
    )
    sinks = sinks if sinks is not None else seq_lens  # a placeholder, never read
    _decode_kernel[(num_seqs, kv_heads, num_parts)](
        q,
        k_cache,
        v_cache,
        out,
        part_acc,
        part_ml,
        seq_ids,
        query_start_loc,
        seq_lens,
        block_tables,
        sinks,
        *q.stride(),
        *out.stride(),
        *k_cache.stride(),
        block_tables.stride(0),
        scale,
        softcap or 0.0,
        min_part,
        GROUP=heads // kv_heads,
        GROUP_PAD=tiles.group_pad,
        BLOCK_SIZE=kv_cache.shape[2],
        HAS_SOFTCAP=softcap is not None,
        INT8=kv_cache.dtype == torch.int8,
        IEEE=q.dtype == torch.float32,
        num_warps=tiles.num_warps,
        **common,
    )
    if num_parts > 1:
        _reduce_kernel[(num_seqs, heads)](
            out,
            part_acc,
            part_ml,
            seq_ids,
            query_start_loc,
            seq_lens,
            sinks,
            *out.stride(),
            min_part,
            **common,
        )

"""Reference attention over the paged KV cache in plain PyTorch: runs on any device.

`build_metadata` plans once per step and KV group which cache slots each sequence attends to
(`TorchAttentionMetadata`); every layer of the group reuses the plan:

* decode sequences (one new token) are batched: their context slots are gathered into a padded
  [seqs, context] index, and the query heads that share a KV head are folded into one matrix so
  a single matmul covers them (no K/V copy per query head);
* sequences with several new tokens (prefill chunks) run one at a time with a causal (and, for
  sliding layers, windowed) mask, since their shapes differ.

The softmax runs in float32, as HF transformers' eager attention does. An int8 cache holds
quantised rows with their scales (inferd/kv_int8.py): `store_kv` quantises, every read
dequantises the rows it gathered. Nothing here calls
compiled code: this is the backend the HF parity tests check, and the `cpu` backend
(cpu_backend.py) reuses its plans with decode attention in C.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from inferd.attention.backend import (
    AttentionBackend,
    AttentionBatch,
    GroupBatch,
    LayerAttentionSpec,
)
from inferd.fp8 import FP8, saturate_to_fp8
from inferd.kv_int8 import INT8_KV, dequantize, quantize

# Decode steps with at least this many (sequence, key) pairs run their products in the cache
# dtype; smaller ones in float32 (see TorchAttentionBackend._decode).
LARGE_DECODE = 4096


@dataclass
class DecodePlan:
    """The decode sequences of one KV group: whole cache blocks covering each one's context."""

    token_idx: torch.Tensor | None  # [n] rows of q that are decode tokens; None = all, in order
    blocks: torch.Tensor  # [n * width] cache blocks covering each sequence's visible context
    width: int  # blocks per sequence (shorter contexts padded with the null block)
    starts: torch.Tensor  # [n] int64: the position of each sequence's first block's first slot
    lens: torch.Tensor  # [n] int64: context lengths
    window: int | None
    block_size: int
    memo: dict = field(default_factory=dict)  # what is derived from the plan, made on first use

    def bias_for(self, kv_heads: int, dtype: torch.dtype) -> torch.Tensor:
        """[n * kv_heads, 1, width * block_size] in `dtype`: 0 where a key is visible, else
        -inf. Made once per step, on first use (the C kernel needs none), in the plan's memo,
        which only this step's layers read."""
        key = (kv_heads, dtype)
        if key not in self.memo:
            span = torch.arange(self.width * self.block_size, device=self.starts.device)
            pos = self.starts[:, None] + span[None, :]
            visible = pos < self.lens[:, None]
            if self.window is not None:
                visible &= pos >= (self.lens - self.window)[:, None]
            bias = torch.zeros(visible.shape, device=pos.device)
            bias = bias.masked_fill_(~visible, float("-inf"))[:, None, :]
            self.memo[key] = bias.repeat_interleave(kv_heads, 0).to(dtype)
        return self.memo[key]


@dataclass
class ChunkPlan:
    """A sequence with several new tokens (a prefill chunk)."""

    start: int  # first row of q
    length: int  # new tokens
    slots: torch.Tensor  # [keys] cache slots of the visible context
    bias: torch.Tensor  # [length, keys] 0 / -inf (causal + window)


def _slots_of(block_tables: torch.Tensor, pos: torch.Tensor, block_size: int) -> torch.Tensor:
    """Cache slots of absolute positions `pos` ([seqs, n]) under each sequence's block table."""
    blocks = torch.gather(block_tables.long(), 1, torch.div(pos, block_size, rounding_mode="floor"))
    return blocks * block_size + pos % block_size


@dataclass
class GroupPlan:
    decode: DecodePlan | None
    chunks: list[ChunkPlan]


@dataclass
class TorchAttentionMetadata:
    """The torch (and cpu) backends' plan of a step: one `GroupPlan` per KV group."""

    groups: list[GroupPlan]
    slot_mappings: list[torch.Tensor]  # per group, the cache slot of every new token


def _plan(meta: AttentionBatch, g: GroupBatch) -> GroupPlan:
    device = g.slot_mapping.device
    decode_seqs, chunks = [], []
    offset = 0
    for s, (q_len, n) in enumerate(zip(meta.query_lens_cpu, meta.seq_lens_cpu)):
        if q_len == 1:
            decode_seqs.append((s, offset, n))
        elif q_len > 1:
            first_q = n - q_len
            k_start = 0 if g.window is None else max(0, first_q - g.window + 1)
            key_pos = torch.arange(k_start, n, device=device)
            q_pos = torch.arange(first_q, n, device=device)
            slots = _slots_of(g.block_tables[s : s + 1], key_pos[None], g.block_size)[0]
            visible = key_pos[None, :] <= q_pos[:, None]
            if g.window is not None:
                visible &= q_pos[:, None] - key_pos[None, :] < g.window
            bias = torch.zeros(visible.shape, device=device).masked_fill_(~visible, float("-inf"))
            chunks.append(ChunkPlan(offset, q_len, slots, bias))
        offset += q_len
    decode = _decode_plan(meta, g, decode_seqs) if decode_seqs else None
    return GroupPlan(decode, chunks)


def _decode_plan(meta: AttentionBatch, g: GroupBatch, decode_seqs) -> DecodePlan:
    """Whole cache blocks per decode sequence: from the block holding its first visible key
    (the window start, or 0) to the block of its newest token. Copying whole 16-token blocks is
    ~4x faster than gathering token slots one by one."""
    device, bs = g.slot_mapping.device, g.block_size
    seq_idx = torch.tensor([d[0] for d in decode_seqs], device=device)
    lens = torch.tensor([d[2] for d in decode_seqs], device=device)
    firsts = [0 if g.window is None else max(0, n - g.window) // bs for _, _, n in decode_seqs]
    width = max((n - 1) // bs - f + 1 for (_, _, n), f in zip(decode_seqs, firsts))
    first = torch.tensor(firsts, device=device)
    index = first[:, None] + torch.arange(width, device=device)[None, :]
    last = torch.div(lens - 1, bs, rounding_mode="floor")
    tables = g.block_tables[seq_idx].long()
    blocks = torch.gather(tables, 1, index.clamp(max=tables.shape[1] - 1))
    # NOTE: past a sequence's last block the null block 0 is read; it holds zeros (the runner
    # clears it), so padding never brings NaN into the products before it is masked.
    blocks = torch.where(index <= last[:, None], blocks, 0)
    token_idx = None
    if len(decode_seqs) != len(meta.query_lens_cpu):
        token_idx = torch.tensor([d[1] for d in decode_seqs], device=device)
    return DecodePlan(token_idx, blocks.flatten(), width, first * bs, lens, g.window, bs)


def _compute_dtype(cache_dtype: torch.dtype) -> torch.dtype:
    """Products run in the cache dtype, except for 8-bit caches (no fp8 or int8 matmul here,
    and 8 bits of a value fit bf16's mantissa): bf16."""
    return torch.bfloat16 if cache_dtype in (FP8, INT8_KV) else cache_dtype


def _values(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cache rows [..., width] gathered from the pool as values [..., head_dim] in `dtype`: int8
    rows dequantised (codes x their scale), others cast."""
    return dequantize(rows, dtype) if rows.dtype == INT8_KV else rows.to(dtype)


def _store(flat: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> None:
    """Write new keys or values into their cache slots. fp8 caches saturate at ±448 (e4m3's
    largest value) and are written through a byte view (no fp8 index_copy on CPU); int8 caches
    take each row's codes and scale."""
    if flat.dtype == FP8:
        flat.view(torch.uint8).index_copy_(0, slots, saturate_to_fp8(x).view(torch.uint8))
    elif flat.dtype == INT8_KV:
        flat.index_copy_(0, slots, quantize(x))
    else:
        flat.index_copy_(0, slots, x.to(flat.dtype))


def store_kv(kv_cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """A layer's new keys and values into their slots of its cache [2, blocks, bs, kv, width]
    (width: head_dim, or head_dim + 4 for int8 rows)."""
    heads, width = kv_cache.shape[-2:]
    _store(kv_cache[0].view(-1, heads, width), slots, k)
    _store(kv_cache[1].view(-1, heads, width), slots, v)


def _per_kv_head(x: torch.Tensor) -> torch.Tensor:
    """[n, span, kv_heads, dim] → [n * kv_heads, span, dim] (a free view for one KV head)."""
    n, span, heads, dim = x.shape
    if heads == 1:
        return x.view(n, span, dim)
    return x.permute(0, 2, 1, 3).reshape(n * heads, span, dim)


def _scores_to_probs(scores: torch.Tensor, spec: LayerAttentionSpec, bias: torch.Tensor,
                     sinks: torch.Tensor | None = None):  # fmt: skip
    """float32 softmax over the last dim. `sinks`: each query row's sink logit, shaped as
    `scores` with 1 key: a column joined to the softmax, then dropped (HF's eager gpt-oss)."""
    if spec.softcap is not None:
        scores = torch.tanh(scores / spec.softcap) * spec.softcap
    logits = scores.float() + bias
    if sinks is None:
        return torch.softmax(logits, dim=-1)
    return torch.softmax(torch.cat([logits, sinks], dim=-1), dim=-1)[..., :-1]


class TorchAttentionBackend(AttentionBackend[TorchAttentionMetadata]):
    name = "torch"
    float32_queries = True

    def build_metadata(self, batch: AttentionBatch) -> TorchAttentionMetadata:
        return TorchAttentionMetadata(
            [_plan(batch, g) for g in batch.groups], [g.slot_mapping for g in batch.groups]
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        spec: LayerAttentionSpec,
        metadata: TorchAttentionMetadata,
    ) -> torch.Tensor:
        kv_heads, head_dim = spec.num_kv_heads, spec.head_dim
        k_flat = kv_cache[0].view(-1, kv_heads, kv_cache.shape[-1])
        v_flat = kv_cache[1].view(-1, kv_heads, kv_cache.shape[-1])
        store_kv(kv_cache, metadata.slot_mappings[spec.group], k, v)
        plan = metadata.groups[spec.group]
        decode, chunks = plan.decode, plan.chunks
        if decode is not None and decode.token_idx is None:  # a pure decode step
            return self._decode(q, kv_cache, decode, spec, v.dtype)
        group_size = spec.num_heads // kv_heads
        out = torch.empty(q.shape, dtype=v.dtype, device=q.device)
        if decode is not None:
            out.index_copy_(0, decode.token_idx, self._decode(q, kv_cache, decode, spec, v.dtype))
        dtype = _compute_dtype(k_flat.dtype)  # prefill products: bf16 GEMMs are fast
        for c in chunks:
            # [kv_heads, group * length, head_dim] against [kv_heads, head_dim, keys]
            qc = q[c.start : c.start + c.length].view(c.length, kv_heads, group_size, head_dim)
            qc = qc.permute(1, 2, 0, 3).to(dtype)
            keys = _values(k_flat[c.slots], dtype).permute(1, 2, 0)
            scores = torch.matmul(qc, keys[:, None]) * spec.scale
            sinks = None
            if spec.sinks is not None:  # [kv_heads, group, length, 1], as the scores
                sinks = spec.sinks.view(kv_heads, group_size, 1, 1).expand(-1, -1, c.length, 1)
            probs = _scores_to_probs(scores, spec, c.bias, sinks).to(dtype)
            values = _values(v_flat[c.slots], dtype).permute(1, 0, 2)
            res = torch.matmul(probs, values[:, None])  # [kv_heads, group, length, head_dim]
            out[c.start : c.start + c.length] = res.permute(2, 0, 1, 3).reshape(
                c.length, spec.num_heads, head_dim
            )
        return out

    def _decode(self, q, kv_cache, plan: DecodePlan, spec: LayerAttentionSpec,
                v_dtype: torch.dtype) -> torch.Tensor:  # fmt: skip
        qd = q if plan.token_idx is None else q.index_select(0, plan.token_idx)
        # The output feeds o_proj, in the projections' dtype (that of v).
        return self.decode_attention(qd, kv_cache, plan, spec).to(v_dtype)

    def decode_attention(self, q: torch.Tensor, kv_cache: torch.Tensor, plan: DecodePlan,
                         spec: LayerAttentionSpec) -> torch.Tensor:  # fmt: skip
        """q [n, heads, dim] of the plan's sequences, one new token each (already stored).
        The query heads sharing a KV head form the rows of one matrix product against that
        head's keys: [n·kv, group, dim] @ [n·kv, dim, span].

        NOTE: small steps run the products in float32, large ones in the cache dtype. A bf16
        batched matmul on CPU goes through oneDNN with a threaded region per call: for a
        single sequence float32 is faster (and it measured 8 ms instead of 0.01 ms in bf16
        when another process held a core); for 32 sequences x 384 keys bf16 is 3x faster.
        """
        kv_heads, head_dim = spec.num_kv_heads, spec.head_dim
        n = q.shape[0]
        span = plan.width * kv_cache.shape[2]
        dtype = _compute_dtype(kv_cache.dtype) if n * span >= LARGE_DECODE else torch.float32
        if spec.softcap is not None or spec.sinks is not None:
            dtype = torch.float32
        group = spec.num_heads // kv_heads
        qd = q.reshape(n * kv_heads, group, head_dim).to(dtype)
        keys, values = (
            _per_kv_head(_values(kv_cache[i].index_select(0, plan.blocks), dtype)
                         .view(n, span, kv_heads, head_dim))
            for i in (0, 1)
        )  # fmt: skip
        bias = plan.bias_for(kv_heads, dtype)
        if spec.softcap is None and spec.sinks is None:
            scores = torch.baddbmm(bias, qd, keys.transpose(1, 2), alpha=spec.scale)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
        else:
            scores = torch.bmm(qd, keys.transpose(1, 2)) * spec.scale
            sinks = None
            if spec.sinks is not None:  # [n * kv_heads, group, 1], as the scores
                sinks = spec.sinks.view(1, kv_heads * group, 1).expand(n, -1, 1)
                sinks = sinks.reshape(n * kv_heads, group, 1)
            probs = _scores_to_probs(scores, spec, bias, sinks)
        return torch.bmm(probs, values).view(n, spec.num_heads, head_dim)

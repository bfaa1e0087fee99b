"""Reference attention over the paged KV cache in plain PyTorch: runs on any device.

Per step and per KV group it plans once (on the group's first layer) which cache slots each
sequence attends to, then every layer of the group reuses the plan:

* decode sequences (one new token) are batched: their context slots are gathered into a padded
  [seqs, context] index, and the query heads that share a KV head are folded into one matrix so
  a single matmul covers them (no K/V copy per query head);
* sequences with several new tokens (prefill chunks) run one at a time with a causal (and, for
  sliding layers, windowed) mask, since their shapes differ.

The softmax runs in float32, as HF transformers' eager attention does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from inferd.attention.backend import (
    AttentionBackend,
    AttentionMetadata,
    GroupMetadata,
    LayerAttentionSpec,
)


@dataclass
class _DecodePlan:
    token_idx: torch.Tensor | None  # [n] rows of q that are decode tokens; None = all, in order
    slots: torch.Tensor  # [n, span] cache slots of their context
    bias: torch.Tensor  # [n, 1, span] float32: 0 where a key is visible, -inf elsewhere
    _converted: dict = field(default_factory=dict)

    def bias_for(self, kv_heads: int) -> torch.Tensor:
        """The bias repeated per KV head (made once per step, not per layer)."""
        if kv_heads not in self._converted:
            self._converted[kv_heads] = self.bias.repeat_interleave(kv_heads, 0)
        return self._converted[kv_heads]


@dataclass
class _ChunkPlan:
    start: int  # first row of q
    length: int  # new tokens
    slots: torch.Tensor  # [keys] cache slots of the visible context
    bias: torch.Tensor  # [length, keys] 0 / -inf (causal + window)


def _slots_of(block_tables: torch.Tensor, pos: torch.Tensor, block_size: int) -> torch.Tensor:
    """Cache slots of absolute positions `pos` ([seqs, n]) under each sequence's block table."""
    blocks = torch.gather(block_tables.long(), 1, torch.div(pos, block_size, rounding_mode="floor"))
    return blocks * block_size + pos % block_size


def _plan(meta: AttentionMetadata, g: GroupMetadata) -> tuple[_DecodePlan | None, list[_ChunkPlan]]:
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
            chunks.append(_ChunkPlan(offset, q_len, slots, bias))
        offset += q_len
    decode = None
    if decode_seqs:
        seq_idx = torch.tensor([d[0] for d in decode_seqs], device=device)
        lens = torch.tensor([d[2] for d in decode_seqs], device=device)
        longest = max(d[2] for d in decode_seqs)
        span = longest if g.window is None else min(longest, g.window)
        start = (lens - span).clamp(min=0)
        pos = start[:, None] + torch.arange(span, device=device)[None, :]
        visible = pos < lens[:, None]
        pos = torch.minimum(pos, lens[:, None] - 1)  # padding reads a real slot, then is masked
        slots = _slots_of(g.block_tables[seq_idx], pos, g.block_size)
        bias = torch.zeros(visible.shape, device=device).masked_fill_(~visible, float("-inf"))
        token_idx = None
        if len(decode_seqs) != len(meta.query_lens_cpu):
            token_idx = torch.tensor([d[1] for d in decode_seqs], device=device)
        decode = _DecodePlan(token_idx, slots, bias[:, None, :])
    return decode, chunks


def _per_kv_head(x: torch.Tensor) -> torch.Tensor:
    """[n, span, kv_heads, dim] → [n * kv_heads, span, dim] (a free view for one KV head)."""
    n, span, heads, dim = x.shape
    if heads == 1:
        return x.view(n, span, dim)
    return x.permute(0, 2, 1, 3).reshape(n * heads, span, dim)


def _scores_to_probs(scores: torch.Tensor, spec: LayerAttentionSpec, bias: torch.Tensor):
    if spec.softcap is not None:
        scores = torch.tanh(scores / spec.softcap) * spec.softcap
    return torch.softmax(scores.float() + bias, dim=-1)


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        spec: LayerAttentionSpec,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        g = meta.groups[spec.group]
        kv_heads, head_dim = spec.num_kv_heads, spec.head_dim
        k_flat = kv_cache[0].view(-1, kv_heads, head_dim)
        v_flat = kv_cache[1].view(-1, kv_heads, head_dim)
        k_flat.index_copy_(0, g.slot_mapping, k.to(k_flat.dtype))
        v_flat.index_copy_(0, g.slot_mapping, v.to(v_flat.dtype))

        plan = g.cache.get("torch")
        if plan is None:
            plan = g.cache["torch"] = _plan(meta, g)
        decode, chunks = plan
        if decode is not None and decode.token_idx is None:  # a pure decode step
            return self._decode(q, k_flat, v_flat, decode, spec)
        group_size = spec.num_heads // kv_heads
        out = torch.empty_like(q)
        if decode is not None:
            out.index_copy_(0, decode.token_idx, self._decode(q, k_flat, v_flat, decode, spec))
        for c in chunks:
            # [kv_heads, group * length, head_dim] against [kv_heads, head_dim, keys]
            qc = q[c.start : c.start + c.length].view(c.length, kv_heads, group_size, head_dim)
            qc = qc.permute(1, 2, 0, 3)
            keys = k_flat[c.slots].permute(1, 2, 0).to(q.dtype)
            scores = torch.matmul(qc, keys[:, None]) * spec.scale
            probs = _scores_to_probs(scores, spec, c.bias).to(q.dtype)
            values = v_flat[c.slots].permute(1, 0, 2).to(q.dtype)
            res = torch.matmul(probs, values[:, None])  # [kv_heads, group, length, head_dim]
            out[c.start : c.start + c.length] = res.permute(2, 0, 1, 3).reshape(
                c.length, spec.num_heads, head_dim
            )
        return out

    @staticmethod
    def _decode(q, k_flat, v_flat, plan: _DecodePlan, spec: LayerAttentionSpec) -> torch.Tensor:
        """One new token per sequence. The query heads sharing a KV head form the rows of one
        matrix product against that head's keys: [n·kv, group, dim] @ [n·kv, dim, span].

        NOTE: the products run in float32 even for bf16 models. They are tiny, and on CPU
        PyTorch's bf16 batched matmul goes through oneDNN with a threaded region per call,
        which measured 0.01 ms in fp32 but up to 8 ms in bf16 when another process held a core.
        """
        kv_heads, head_dim = spec.num_kv_heads, spec.head_dim
        qd = q if plan.token_idx is None else q.index_select(0, plan.token_idx)
        n = qd.shape[0]
        qd = qd.reshape(n * kv_heads, spec.num_heads // kv_heads, head_dim).float()
        keys = _per_kv_head(k_flat[plan.slots]).float()
        bias = plan.bias_for(kv_heads)
        if spec.softcap is None:
            scores = torch.baddbmm(bias, qd, keys.transpose(1, 2), alpha=spec.scale)
            probs = torch.softmax(scores, dim=-1)
        else:
            scores = torch.bmm(qd, keys.transpose(1, 2)) * spec.scale
            probs = _scores_to_probs(scores, spec, bias)
        values = _per_kv_head(v_flat[plan.slots]).float()
        return torch.bmm(probs, values).view(n, spec.num_heads, head_dim).to(q.dtype)

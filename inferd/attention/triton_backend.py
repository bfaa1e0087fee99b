"""Paged attention in Triton: the GPU fast path, checked on CPU through the Triton interpreter.

Per layer: the new keys/values are stored in their cache slots, then sequences with one new
token run the split-KV decode kernel and sequences with several (prefill chunks, possibly after
cached context) run the paged prefill kernel; both write disjoint rows of one output.

What the kernels need beyond the step's metadata — which sequences are decodes, the prefill
work list, how many partitions a decode uses — is planned once per step and KV group, on the
group's first layer, and kept in the group's `cache` for the other layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from inferd.attention.backend import (
    AttentionBackend,
    AttentionMetadata,
    GroupMetadata,
    LayerAttentionSpec,
)
from inferd.attention.triton_kernels import (
    Tiles,
    decode_tiles,
    paged_decode,
    paged_prefill,
    prefill_tiles,
    store_kv,
)

MAX_DECODE_PARTITIONS = 16


@dataclass
class _Plan:
    prefill: Tiles
    decode: Tiles
    work: torch.Tensor | None  # [items, 2] int32 (sequence, first query token); None = none
    decode_seqs: torch.Tensor | None  # [n] int32; None when every sequence decodes
    num_decode: int
    num_parts: int


class TritonAttentionBackend(AttentionBackend):
    """`decode_partitions` fixes the split of decode contexts (a power of two); None picks it per
    step to give the GPU about two programs per SM. A fixed value keeps the launch grid
    independent of context lengths, as CUDA-graph capture needs. A partition holds at least
    `min_partition` keys, so short contexts are not split into slivers."""

    name = "triton"

    def __init__(self, decode_partitions: int | None = None, min_partition: int = 256):
        if decode_partitions is not None and (
            decode_partitions < 1 or decode_partitions & (decode_partitions - 1)
        ):
            raise ValueError(f"decode_partitions must be a power of two, got {decode_partitions}")
        if min_partition < 1:
            raise ValueError(f"min_partition must be at least 1, got {min_partition}")
        self.decode_partitions = decode_partitions
        self.min_partition = min_partition
        self._sm_counts: dict[int, int] = {}

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
        store_kv(k, v, kv_cache, g.slot_mapping)
        key = ("triton", spec.num_heads, spec.num_kv_heads, spec.head_dim, q.dtype)
        plan = g.cache.get(key)
        if plan is None:
            plan = g.cache[key] = self._plan(meta, g, spec, q)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if plan.work is not None:
            paged_prefill(
                q,
                kv_cache,
                out,
                plan.work,
                meta.query_start_loc,
                meta.seq_lens,
                g.block_tables,
                plan.prefill,
                spec.scale,
                g.window,
                spec.softcap,
            )
        paged_decode(
            q,
            kv_cache,
            out,
            plan.decode_seqs,
            plan.num_decode,
            meta.query_start_loc,
            meta.seq_lens,
            g.block_tables,
            plan.decode,
            spec.scale,
            g.window,
            spec.softcap,
            plan.num_parts,
            self.min_partition,
        )
        return out

    def _plan(
        self, meta: AttentionMetadata, g: GroupMetadata, spec: LayerAttentionSpec, q: torch.Tensor
    ) -> _Plan:
        device = q.device
        if spec.num_heads % spec.num_kv_heads:
            raise ValueError(
                f"num_heads ({spec.num_heads}) must be a multiple of num_kv_heads "
                f"({spec.num_kv_heads})"
            )
        group = spec.num_heads // spec.num_kv_heads
        # The same tiles on every device, so the interpreter tests run the GPU's tiling.
        pre = prefill_tiles(spec.head_dim, group, exact_fp32=q.dtype == torch.float32)
        dec = decode_tiles(spec.head_dim, group)
        work: list[int] = []
        decodes: list[int] = []
        spans: list[int] = []
        for s, (q_len, seq_len) in enumerate(
            zip(meta.query_lens_cpu, meta.seq_lens_cpu, strict=True)
        ):
            if q_len == 1:
                decodes.append(s)
                spans.append(seq_len if g.window is None else min(seq_len, g.window))
            elif q_len > 1:
                for q0 in range(0, q_len, pre.block_q):
                    work.extend((s, q0))
        all_decode = len(decodes) == meta.num_seqs
        return _Plan(
            prefill=pre,
            decode=dec,
            work=torch.tensor(work, dtype=torch.int32, device=device).view(-1, 2) if work else None,
            decode_seqs=None
            if all_decode
            else torch.tensor(decodes, dtype=torch.int32, device=device),
            num_decode=len(decodes),
            num_parts=self._num_parts(len(decodes), spec.num_kv_heads, spans, device),
        )

    def _num_parts(self, num_decode: int, kv_heads: int, spans: list[int], device) -> int:
        if self.decode_partitions is not None:
            return self.decode_partitions
        if not spans or device.type != "cuda":
            return 1
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._sm_counts:
            props = torch.cuda.get_device_properties(index)
            self._sm_counts[index] = props.multi_processor_count
        wanted = triton.cdiv(2 * self._sm_counts[index], num_decode * kv_heads)
        useful = triton.cdiv(max(spans), self.min_partition)  # more would only idle
        parts = min(wanted, useful, MAX_DECODE_PARTITIONS)
        return triton.next_power_of_2(parts)

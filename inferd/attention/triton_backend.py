"""Paged attention in Triton: the GPU fast path, checked on CPU through the Triton interpreter.

Per layer: the new keys/values are stored in their cache slots, then sequences with one new
token run the split-KV decode kernel and sequences with several (prefill chunks, possibly after
cached context) run the paged prefill kernel; both write disjoint rows of one output.

An int8 cache (inferd/kv_int8.py) is quantised by `store_kv` as PyTorch quantises it; the
attention kernels multiply q by the keys' codes and scale each key's scores by its scale, and
fold each value row's scale into its probability column before the product with the codes.

What the kernels need beyond the step's layout — which sequences are decodes, the prefill
work list, how many partitions a decode uses — is planned by `build_metadata` once per step
(`TritonAttentionMetadata`, one `TritonGroupPlan` per KV group) and read by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton

from inferd.attention.backend import (
    AttentionBackend,
    AttentionBatch,
    GroupBatch,
    LayerAttentionSpec,
)
from inferd.attention.triton_kernels import (
    decode_tiles,
    paged_decode,
    paged_prefill,
    prefill_tiles,
    store_kv,
)

MAX_DECODE_PARTITIONS = 16


@dataclass
class TritonGroupPlan:
    """One KV group's share of a step, as the kernels need it."""

    group: GroupBatch
    decode_seqs: torch.Tensor | None  # [n] int32 sequences with one new token; None = all
    num_decode: int
    decode_spans: list[int]  # visible keys of each decode sequence (for the decode split)
    prefill_seqs: list[tuple[int, int]]  # (sequence, new tokens) of those with several
    # Prefill work lists by query tile height: the tiles depend on the layer's head geometry
    # and dtype, which the step's layout does not know; made on the first layer that asks.
    _work: dict[int, torch.Tensor | None] = field(default_factory=dict)

    def prefill_work(self, block_q: int, device: torch.device) -> torch.Tensor | None:
        """[items, 2] int32 (sequence, first query token of a tile); None when no sequence
        prefills."""
        if block_q not in self._work:
            work = [x for s, n in self.prefill_seqs for q0 in range(0, n, block_q) for x in (s, q0)]
            self._work[block_q] = (
                torch.tensor(work, dtype=torch.int32, device=device).view(-1, 2) if work else None
            )
        return self._work[block_q]


@dataclass
class TritonAttentionMetadata:
    batch: AttentionBatch
    groups: list[TritonGroupPlan]
    decode_partitions: int | None  # fixed split of decode contexts; None: chosen per layer


def _check_partitions(decode_partitions: int | None) -> None:
    if decode_partitions is not None and (
        decode_partitions < 1 or decode_partitions & (decode_partitions - 1)
    ):
        raise ValueError(f"decode_partitions must be a power of two, got {decode_partitions}")


class TritonAttentionBackend(AttentionBackend[TritonAttentionMetadata]):
    """`decode_partitions` fixes the split of decode contexts (a power of two); None picks it per
    step to give the GPU about two programs per SM. A fixed value keeps the launch grid
    independent of context lengths, as CUDA-graph capture needs. A partition holds at least
    `min_partition` keys, so short contexts are not split into slivers."""

    name = "triton"

    def __init__(self, decode_partitions: int | None = None, min_partition: int = 256):
        _check_partitions(decode_partitions)
        if min_partition < 1:
            raise ValueError(f"min_partition must be at least 1, got {min_partition}")
        self.decode_partitions = decode_partitions
        self.min_partition = min_partition
        self._sm_counts: dict[int, int] = {}

    def build_metadata(
        self, batch: AttentionBatch, decode_partitions: int | None = None
    ) -> TritonAttentionMetadata:
        """`decode_partitions` fixes the decode split of this step (CUDA-graph capture: the
        grid must not depend on context lengths); default: the backend's own setting."""
        _check_partitions(decode_partitions)
        groups = []
        for g in batch.groups:
            decodes: list[int] = []
            spans: list[int] = []
            prefills: list[tuple[int, int]] = []
            for s, (q_len, seq_len) in enumerate(
                zip(batch.query_lens_cpu, batch.seq_lens_cpu, strict=True)
            ):
                if q_len == 1:
                    decodes.append(s)
                    spans.append(seq_len if g.window is None else min(seq_len, g.window))
                elif q_len > 1:
                    prefills.append((s, q_len))
            all_decode = len(decodes) == batch.num_seqs
            device = g.slot_mapping.device
            seqs = None if all_decode else torch.tensor(decodes, dtype=torch.int32, device=device)
            groups.append(TritonGroupPlan(g, seqs, len(decodes), spans, prefills))
        return TritonAttentionMetadata(batch, groups, decode_partitions or self.decode_partitions)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        spec: LayerAttentionSpec,
        metadata: TritonAttentionMetadata,
    ) -> torch.Tensor:
        plan = metadata.groups[spec.group]
        g, batch = plan.group, metadata.batch
        store_kv(k, v, kv_cache, g.slot_mapping)
        if spec.num_heads % spec.num_kv_heads:
            raise ValueError(
                f"num_heads ({spec.num_heads}) must be a multiple of num_kv_heads "
                f"({spec.num_kv_heads})"
            )
        group = spec.num_heads // spec.num_kv_heads
        # The same tiles on every device, so the interpreter tests run the GPU's tiling.
        pre = prefill_tiles(spec.head_dim, group, exact_fp32=q.dtype == torch.float32)
        dec = decode_tiles(spec.head_dim, group)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        work = plan.prefill_work(pre.block_q, q.device)
        if work is not None:
            paged_prefill(
                q,
                kv_cache,
                out,
                work,
                batch.query_start_loc,
                batch.seq_lens,
                g.block_tables,
                pre,
                spec.scale,
                g.window,
                spec.softcap,
                spec.sinks,
            )
        parts = metadata.decode_partitions or self._num_parts(
            plan.num_decode, spec.num_kv_heads, plan.decode_spans, q.device
        )
        paged_decode(
            q,
            kv_cache,
            out,
            plan.decode_seqs,
            plan.num_decode,
            batch.query_start_loc,
            batch.seq_lens,
            g.block_tables,
            dec,
            spec.scale,
            g.window,
            spec.softcap,
            parts,
            self.min_partition,
            spec.sinks,
        )
        return out

    def _num_parts(self, num_decode: int, kv_heads: int, spans: list[int], device) -> int:
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

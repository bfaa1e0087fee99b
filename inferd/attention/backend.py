"""The attention backend contract and the description of a step it works from.

A step runs the flattened new tokens of several sequences at once. For every sequence the runner
knows how many tokens it already has in the KV cache and how many it adds now; it writes that
down once per step as an `AttentionBatch`. Then, once per step:

    metadata = backend.build_metadata(batch)            # the backend's own plan, typed
    out = backend.forward(q, k, v, kv_cache, spec, metadata)   # every attention layer

Each backend decides what its metadata holds (which cache slots each sequence reads, kernel work
lists, ...) and nothing else writes into it. Code outside a backend that needs part of a plan
(the C decoder layer, `inferd/models/cpu_decoder.py`) asks through the metadata's public
methods.

KV memory is organised in *groups* of layers that share block tables: a model with only
full-attention layers has one group; Gemma 3 has a full-attention group and a sliding-window
group, because the sliding layers only keep the blocks inside their window (see
`inferd/engine/scheduling/kv_cache.py`). A layer's cache is a tensor [2, num_blocks, block_size,
kv_heads, head_dim] from its group's pool; token t of a sequence lives in slot
`block_table[t // block_size] * block_size + t % block_size`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import torch


@dataclass
class GroupBatch:
    """Where one KV group's layers store and find keys/values this step."""

    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot of each new token
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32; unused entries are 0
    block_size: int
    window: int | None  # sliding window of the group's layers (tokens), None = full


@dataclass
class AttentionBatch:
    """One step's layout of new tokens, shared by every attention layer (built by the runner)."""

    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: offsets of each sequence's new tokens
    seq_lens: torch.Tensor  # [num_seqs] int32: tokens in context after this step
    positions: torch.Tensor  # [num_tokens] int64: absolute position of every new token
    groups: list[GroupBatch]
    # Host copies so backends can plan without device synchronisation.
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @property
    def is_decode_only(self) -> bool:
        return all(n == 1 for n in self.query_lens_cpu)


@dataclass(frozen=True)
class LayerAttentionSpec:
    """What a backend needs to know about one attention layer."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    window: int | None
    softcap: float | None
    group: int  # index of the layer's KV group
    index_in_group: int  # which cache tensor of that group
    # gpt-oss's attention sinks: per query head a learned logit that joins the softmax's
    # denominator and weighs no value (float32 [num_heads], this rank's heads); None: none.
    sinks: torch.Tensor | None = field(default=None, compare=False)


Metadata = TypeVar("Metadata")


class AttentionBackend(ABC, Generic[Metadata]):
    """Stores the new keys/values of a layer in its cache and attends over the cache."""

    name: ClassVar[str] = "abstract"
    # Whether q (and k) may arrive in float32 for a lower-precision model; otherwise the layer
    # hands them over in the projections' dtype.
    float32_queries: ClassVar[bool] = False

    @abstractmethod
    def build_metadata(self, batch: AttentionBatch) -> Metadata:
        """Everything this backend derives from the step's layout, once per step; every layer
        of the step reads it and none changes it."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        spec: LayerAttentionSpec,
        metadata: Metadata,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        ...


@dataclass
class ForwardContext:
    """Everything a model's attention layers need for one step: passed down, never global."""

    batch: AttentionBatch
    metadata: Any  # what `backend.build_metadata(batch)` returned
    kv_caches: list[list[torch.Tensor]]  # [group][index_in_group] → layer cache tensor
    backend: AttentionBackend

    @classmethod
    def for_step(cls, batch: AttentionBatch, kv_caches: list[list[torch.Tensor]],
                 backend: AttentionBackend) -> ForwardContext:  # fmt: skip
        return cls(batch, backend.build_metadata(batch), kv_caches, backend)

    def attend(
        self, spec: LayerAttentionSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        cache = self.kv_caches[spec.group][spec.index_in_group]
        return self.backend.forward(q, k, v, cache, spec, self.metadata)

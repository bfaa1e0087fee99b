"""Tensor-parallel group: which rank this process is, how many share the model, and the two
collectives a sharded forward pass needs (all-reduce after row-parallel layers, all-gather of
vocabulary shards of the logits), on PyTorch's own runtime (gloo on CPU, NCCL on GPUs).

How the model is split across N ranks (Megatron-style):

* q/k/v and gate/up projections are column-parallel: each rank computes its own heads and its
  own slice of the MLP's intermediate features, no communication;
* o_proj and down_proj are row-parallel: each rank multiplies its slice of the input features,
  then one all-reduce sums the partial results;
* the embedding and the LM head are split along the vocabulary; lookups outside a rank's range
  give zeros and an all-reduce fills them in; logits are all-gathered;
* with fewer KV heads than ranks, ranks replicate the KV head their query heads use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class TPGroup:
    rank: int = 0
    world_size: int = 1
    # A torch.distributed ProcessGroup when world_size > 1; None again once the rank has left it
    # (`launch.leave_group`), so that nothing keeps the group's threads alive.
    group: object | None = None

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def split(self, n: int, what: str) -> tuple[int, int]:
        """(start, length) of this rank's share of `n` features divided evenly."""
        if n % self.world_size:
            raise ValueError(f"tensor_parallel_size {self.world_size} does not divide {what} ({n})")
        length = n // self.world_size
        return self.rank * length, length

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


SINGLE = TPGroup()


def kv_head_range(num_kv_heads: int, tp: TPGroup) -> tuple[int, int]:
    """(first KV head, count) a rank holds: its share when the heads divide among the ranks,
    else the one head its query heads read (replicated on several ranks)."""
    if num_kv_heads >= tp.world_size:
        return tp.split(num_kv_heads, "the number of KV heads")
    if tp.world_size % num_kv_heads:
        raise ValueError(
            f"tensor_parallel_size {tp.world_size} must divide or be a multiple of the number "
            f"of KV heads ({num_kv_heads})"
        )
    return tp.rank * num_kv_heads // tp.world_size, 1

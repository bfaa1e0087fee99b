"""KV-cache budget on a GPU: what `--gpu-memory-utilization` leaves after weights, the peak
activations of the largest step, and memory outside PyTorch's allocator (CUDA context, NCCL).

    budget = total × utilization − (weights + activation peak + non-torch memory)

The activation peak is measured, not estimated: a dummy step with `max_num_batched_tokens`
tokens spread over `max_num_seqs` sequences runs once against a small scratch KV pool, and the
allocator's peak minus what was allocated before (weights) minus the scratch pool is the answer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GPUBudget:
    total: int
    weights: int
    activation_peak: int
    non_torch: int
    kv_budget: int

    def describe(self) -> str:
        gib = 2**30
        return (
            f"GPU memory: total {self.total / gib:.2f} GiB, weights {self.weights / gib:.2f} GiB, "
            f"activation peak {self.activation_peak / gib:.2f} GiB, outside torch "
            f"{self.non_torch / gib:.2f} GiB -> KV cache {self.kv_budget / gib:.2f} GiB"
        )


def profile_gpu_budget(
    model: torch.nn.Module,
    device: torch.device,
    utilization: float,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    block_size: int,
    kv_dtype: torch.dtype,
) -> GPUBudget:
    from inferd.engine.runner import ModelRunner, SequenceStep

    if not 0 < utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    weights = torch.cuda.memory_allocated(device)
    seqs = max(1, min(max_num_seqs, max_num_batched_tokens))
    per_seq = max_num_batched_tokens // seqs
    blocks = -(-per_seq // block_size)
    groups = len(model.config.kv_groups())
    scratch = ModelRunner(model, [seqs * blocks + 1] * groups, block_size, kv_dtype, device)
    steps = []
    for s in range(seqs):
        table = list(range(1 + s * blocks, 1 + (s + 1) * blocks))
        steps.append(SequenceStep([0] * per_seq, 0, [table] * groups))
    logits = scratch.execute(steps)
    # The sampler works on float32 copies of the logits of every sequence.
    probs = torch.softmax(logits, dim=-1)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    activation_peak = peak - weights - scratch.kv_cache_bytes()
    del scratch, logits, probs, steps
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    non_torch = max(0, total - free - torch.cuda.memory_reserved(device))
    budget = int(total * utilization) - weights - activation_peak - non_torch
    if budget <= 0:
        raise ValueError(
            f"no GPU memory left for the KV cache at gpu_memory_utilization={utilization}: "
            f"weights {weights / 2**30:.2f} GiB + activations {activation_peak / 2**30:.2f} GiB "
            f"+ other {non_torch / 2**30:.2f} GiB of {total / 2**30:.2f} GiB; raise it or lower "
            "max_num_batched_tokens"
        )
    result = GPUBudget(total, weights, activation_peak, non_torch, budget)
    log.info(result.describe())
    return result

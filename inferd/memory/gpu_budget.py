"""KV-cache budget on a GPU: what `--gpu-memory-utilization` leaves after weights, the peak
activations of the largest step, and memory outside PyTorch's allocator (CUDA context, NCCL).

    budget = total × utilization − (weights + activation peak + non-torch memory)

`utilization` is this engine's share of the whole GPU, as in vLLM: memory already in use when
the engine started (another process, such as a second data-parallel replica on the same GPU)
is not charged to it, but the share must fit in what was free then.

The activation peak is measured, not estimated: the engine runs one dummy step of the largest
size it will schedule and reports the allocator's peak (`inferd/engine/scheduling/kv_budget.py`);
this module does the accounting.
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


def check_utilization(utilization: float) -> None:
    if not 0 < utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")


def memory_in_use(device: torch.device) -> int:
    """Bytes of the GPU in use outside this process's allocator: read before the engine loads
    anything, it is what other processes hold (plus this process's CUDA context, which this
    call creates)."""
    free, total = torch.cuda.mem_get_info(device)
    return total - free - torch.cuda.memory_reserved(device)


def gpu_kv_budget(device: torch.device, utilization: float, weights: int, activation_peak: int,
                  in_use_before: int = 0) -> GPUBudget:  # fmt: skip
    """The KV budget once the weights are loaded and the activation peak was measured; reads
    what the device and the caching allocator hold now. `in_use_before`: `memory_in_use` when
    the engine started."""
    check_utilization(utilization)
    free, total = torch.cuda.mem_get_info(device)
    share = int(total * utilization)
    if share > total - in_use_before:
        raise ValueError(
            f"gpu_memory_utilization={utilization} asks for {share / 2**30:.2f} GiB of the GPU, "
            f"but {in_use_before / 2**30:.2f} GiB of its {total / 2**30:.2f} GiB were in use "
            "when the engine started (other processes): lower it"
        )
    non_torch = max(0, total - free - torch.cuda.memory_reserved(device) - in_use_before)
    budget = share - weights - activation_peak - non_torch
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

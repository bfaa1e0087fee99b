"""How many bytes the KV pool gets: `kv_cache_memory` when given, the CPU default, or on a GPU
what `gpu_memory_utilization` leaves once the weights are loaded and the largest step's
activation peak is measured (the accounting is `inferd/memory/gpu_budget.py`)."""

from __future__ import annotations

import torch

from inferd.config import ENGINE_DEFAULTS, EngineConfig
from inferd.engine.execution.device_state import SequenceStep
from inferd.engine.execution.runner import ModelRunner
from inferd.memory.gpu_budget import check_utilization, gpu_kv_budget


def check_kv_flags(config: EngineConfig, device: torch.device) -> None:
    """Refuse a KV sizing flag that would do nothing, before anything loads."""
    if config.gpu_memory_utilization == EngineConfig.gpu_memory_utilization:  # the default
        return
    if device.type != "cuda":
        raise ValueError(
            f"--gpu-memory-utilization sizes the KV cache on a GPU, and this engine "
            f"runs on {device.type}: give --kv-cache-memory instead (default 2GiB)"
        )
    if config.kv_cache_memory is not None:
        raise ValueError("--kv-cache-memory and --gpu-memory-utilization both size the KV cache: "
                         "give one of them")  # fmt: skip


def kv_budget(config: EngineConfig, device: torch.device, model: torch.nn.Module,
              max_num_seqs: int, batched: int, kv_dtype: torch.dtype,
              in_use_before: int = 0) -> int:  # fmt: skip
    """`in_use_before`: GPU memory others held when the engine started (`memory_in_use`)."""
    if config.kv_cache_memory is not None:
        return int(config.kv_cache_memory)
    if device.type == "cuda":
        check_utilization(config.gpu_memory_utilization)
        weights, peak = profile_activation_peak(model, device, batched, max_num_seqs,
                                                config.block_size, kv_dtype)  # fmt: skip
        budget = gpu_kv_budget(device, config.gpu_memory_utilization, weights, peak,
                               in_use_before)  # fmt: skip
        return budget.kv_budget
    return ENGINE_DEFAULTS["cpu"]["kv_cache_memory"]


def profile_activation_peak(
    model: torch.nn.Module,
    device: torch.device,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    block_size: int,
    kv_dtype: torch.dtype,
) -> tuple[int, int]:
    """(bytes allocated before the step: the weights, activation peak of the largest step).
    A dummy step with `max_num_batched_tokens` tokens spread over `max_num_seqs` sequences runs
    once against a small scratch KV pool; its peak minus the weights and the pool is the
    answer."""
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
    return weights, activation_peak

"""The memory part of the dashboard's snapshot (inferd/engine/core/dashboard_view.py): what the
process holds now, and what `inferd memory` predicts for the engine's settings (computed once)."""

from __future__ import annotations

import logging
import os

from inferd.engine_snapshot import MemoryPrediction, MemorySnapshot
from inferd.memory.snapshot import proc_status

log = logging.getLogger(__name__)


def memory_snapshot(device, weights: int, kv_pool: int, predicted: MemoryPrediction | None,
                    cuda=None) -> MemorySnapshot:  # fmt: skip
    """What the process holds now. `device`: a torch.device; `cuda`: where CUDA figures come
    from (torch.cuda unless a test hands in a fake: memory_allocated, memory_reserved and
    mem_get_info, each of a device)."""
    status = proc_status()
    # NOTE: not glibc's heap figures (memory/snapshot.py heap_stats): mallinfo2 walks every
    # arena, tens of milliseconds with a model loaded, which a step must not wait for.
    memory = MemorySnapshot(
        device=device.type,
        weights=weights,
        kv_pool=kv_pool,
        rss=status.get("VmRSS"),
        rss_anon=status.get("RssAnon"),
        rss_peak=status.get("VmHWM"),
        device_total=_ram() if device.type == "cpu" else None,
        predicted=predicted,
    )
    if device.type == "cuda":
        if cuda is None:
            import torch

            cuda = torch.cuda
        free, total = cuda.mem_get_info(device)
        memory.cuda_allocated = cuda.memory_allocated(device)
        memory.cuda_reserved = cuda.memory_reserved(device)
        memory.cuda_device_used, memory.device_total = total - free, total
    return memory


def weight_bytes(model) -> int:
    """Parameters and buffers of the model (what a tensor-parallel rank reports too)."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def _ram() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return None


_DENSE = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}
# a KV cache tensor's dtype as the estimate names it (int8: rows with their scales, kv_int8.py)
_KV = {**_DENSE, "torch.float8_e4m3fn": "fp8", "torch.int8": "int8"}


def predict_memory(engine) -> MemoryPrediction | None:  # an EngineCore (no import: a circle)
    """What `inferd memory` predicts for this engine's model, mode, step budget and context;
    None where its estimate does not cover the settings (it logs why)."""
    from inferd.memory.estimate import estimate_memory
    from inferd.memory.weights import checkpoint_weights

    config, setup = engine.config, engine.setup
    checkpoint = setup.checkpoint
    dtype, block_kernels = _DENSE.get(str(setup.dtype), "auto"), False
    if config.quantization in ("int8", "int4", "fp8"):
        dtype = config.quantization
    elif config.dtype == "auto" and config.quantization in (None, "gguf"):  # gguf: the default
        dtype = "auto"
        if setup.device.type == "cpu" and checkpoint.format == "gguf":
            from inferd.cpu_kernels import kernels_available

            block_kernels = kernels_available()
    try:
        est = estimate_memory(
            engine.model_config,
            dtype=dtype,
            kv_cache_dtype=_KV.get(str(engine.runner.kv_caches[0][0].dtype), "auto"),
            max_model_len=engine.max_model_len,
            concurrency=setup.max_num_seqs,
            max_num_batched_tokens=setup.max_num_batched_tokens,
            tensor_parallel_size=config.tensor_parallel_size,
            device=setup.device.type,
            checkpoint=checkpoint_weights(checkpoint),
            block_kernels=block_kernels,
        )
    except ValueError as e:
        log.info("no memory prediction for the dashboard: %s", e)
        return None
    per_device = est.per_device
    return MemoryPrediction(
        weights=per_device.weights,
        kv_pool=setup.kv_plan.total_bytes,
        activations=per_device.activations.peak_bytes,
        overhead=per_device.overhead.bytes,
    )

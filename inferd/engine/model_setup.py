"""What every rank does to get its model: resolve the dtypes of weights, activations and the KV
cache, pick the attention backend, open the checkpoint and load this rank's shard of the weights.
Rank 0 does it inside `setup.py`; tensor-parallel workers in `tp_workers.py`."""

from __future__ import annotations

import logging

import torch

from inferd.config import EngineConfig
from inferd.distributed.state import SINGLE, TPGroup
from inferd.layers.quant import check_quantization
from inferd.loader import Checkpoint, load_model, open_checkpoint
from inferd.platform import keep_freed_memory_in_heap, resolve_dtype

log = logging.getLogger(__name__)


def _attention_backend(config: EngineConfig, device: torch.device):
    from inferd.attention.torch_backend import TorchAttentionBackend

    choice = config.attention_backend
    if choice not in ("auto", "torch", "triton"):
        raise ValueError(f"attention_backend must be auto, torch or triton, got {choice!r}")
    if choice == "torch" or (choice == "auto" and device.type != "cuda"):
        return TorchAttentionBackend()
    try:
        from inferd.attention.triton_backend import TritonAttentionBackend
    except ImportError as e:
        if choice == "triton":
            raise ValueError("attention_backend triton needs the triton package") from e
        log.warning("triton is not installed: using the torch attention backend on %s", device)
        return TorchAttentionBackend()
    if device.type != "cuda":
        raise ValueError("the triton attention backend runs on CUDA devices only")
    return TritonAttentionBackend()


def resolve_dtypes(config: EngineConfig, device: torch.device) -> tuple[torch.dtype, torch.dtype]:
    """(weights/activations dtype, KV cache dtype)."""
    dtype = resolve_dtype(config.dtype, device)
    if config.quantization:
        check_quantization(config.quantization, device)
        if config.quantization == "gguf":
            pass  # any dtype: it is what steps with many rows dequantise the blocks to
        elif config.dtype == "auto":
            dtype = torch.bfloat16  # the integer kernels take bf16 activations
        elif dtype != torch.bfloat16:
            raise ValueError(f"quantization {config.quantization} needs dtype bfloat16 (or auto)")
    if config.kv_cache_dtype == "auto":
        if config.quantization == "gguf":
            # Activations stay float32 in this mode, and decode attends in float32: a bf16 cache
            # would be converted back on every step (measured ~1 ms per token here).
            return dtype, torch.float32
        return dtype, dtype
    if config.kv_cache_dtype in ("fp8", "fp8_e4m3"):
        return dtype, torch.float8_e4m3fn
    return dtype, resolve_dtype(config.kv_cache_dtype, device)


def load_rank_model(config: EngineConfig, device: torch.device, tp: TPGroup = SINGLE,
                    checkpoint: Checkpoint | None = None):  # fmt: skip
    """What every rank does: this rank's shard of the model, its dtypes and attention backend."""
    keep_freed_memory_in_heap()
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    dtype, kv_dtype = resolve_dtypes(config, device)
    checkpoint = checkpoint or open_checkpoint(config.model)
    backend = _attention_backend(config, device)
    if kv_dtype == torch.float8_e4m3fn and backend.name != "torch":
        raise ValueError("an fp8 KV cache needs --attention-backend torch (the Triton kernels "
                         "read bf16/fp16/fp32 caches)")  # fmt: skip
    model = load_model(checkpoint, dtype, device, config.quantization, tp)
    return model, dtype, kv_dtype, backend

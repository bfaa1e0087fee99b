"""Start-up: pick device and dtype, open the checkpoint, load tokenizer and weights, size the
KV pool from the memory budget, and resolve the scheduler limits."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from inferd.config import ENGINE_DEFAULTS, EngineConfig, ModelConfig
from inferd.distributed.state import SINGLE, TPGroup
from inferd.engine.runner import ModelRunner
from inferd.layers.weight_scheme import WeightScheme, choose_scheme
from inferd.loader import Checkpoint, load_model, open_checkpoint
from inferd.memory.kv import KVPoolPlan, plan_kv_pool
from inferd.memory.weights import tp_shard
from inferd.platform import keep_freed_memory_in_heap, resolve_device, resolve_dtype

log = logging.getLogger(__name__)


@dataclass
class EngineSetup:
    device: torch.device
    dtype: torch.dtype
    checkpoint: Checkpoint
    model_config: ModelConfig
    tokenizer: object
    runner: ModelRunner
    kv_plan: KVPoolPlan
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    load_seconds: float


def _positive(name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _kv_budget(config: EngineConfig, device: torch.device, model: torch.nn.Module,
               max_num_seqs: int, batched: int, kv_dtype: torch.dtype) -> int:  # fmt: skip
    if config.kv_cache_memory is not None:
        return int(config.kv_cache_memory)
    if device.type == "cuda":
        from inferd.memory.gpu_budget import profile_gpu_budget

        return profile_gpu_budget(model, device, config.gpu_memory_utilization, batched,
                                  max_num_seqs, config.block_size, kv_dtype).kv_budget  # fmt: skip
    return ENGINE_DEFAULTS["cpu"]["kv_cache_memory"]


ATTENTION_BACKENDS = ("auto", "torch", "cpu", "triton")


def _attention_backend(config: EngineConfig, device: torch.device):
    """`torch`: plain PyTorch anywhere (the reference); `cpu`: the torch backend with decode
    attention in C; `triton`: the GPU kernels. `auto`: triton on CUDA when installed, cpu on
    CPU when inferd's C kernels build, else torch."""
    from inferd.attention.torch_backend import TorchAttentionBackend

    choice = config.attention_backend
    if choice not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, "
                         f"got {choice!r}")  # fmt: skip
    if choice == "torch":
        return TorchAttentionBackend()
    if choice == "cpu" or (choice == "auto" and device.type == "cpu"):
        return _cpu_backend(choice, device) or TorchAttentionBackend()
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


def _cpu_backend(choice: str, device: torch.device):
    from inferd.attention.cpu_backend import CpuAttentionBackend
    from inferd.cpu_kernels import KernelsUnavailable, kernel_library

    if device.type != "cpu":
        raise ValueError(f"attention_backend cpu runs on the CPU only, not on {device}")
    try:
        return CpuAttentionBackend(kernel_library())
    except KernelsUnavailable as e:
        if choice == "cpu":
            raise ValueError(f"attention_backend cpu needs inferd's C kernels: {e}") from e
        log.warning("inferd's C kernels are unavailable (%s): decode attention runs in PyTorch",
                    e)  # fmt: skip
        return None


def weight_scheme(config: EngineConfig, device: torch.device, checkpoint: Checkpoint | None,
                  tp_size: int = 1) -> WeightScheme:  # fmt: skip
    """How the model holds its weights and which kernels it runs (see layers/weight_scheme.py);
    without a checkpoint, only the flags are checked."""
    return choose_scheme(config.quantization, config.dtype,
                         checkpoint.format if checkpoint is not None else None, device,
                         tp_size)  # fmt: skip


def resolve_dtypes(
    config: EngineConfig, device: torch.device, scheme: WeightScheme | None = None
) -> tuple[torch.dtype, torch.dtype]:
    """(weights/activations dtype, KV cache dtype) of the scheme (by default: of the flags
    alone, which checks them)."""
    scheme = scheme or weight_scheme(config, device, None)
    dtype = scheme.dtype
    if config.kv_cache_dtype == "auto":
        return dtype, scheme.kv_cache_dtype
    if config.kv_cache_dtype in ("fp8", "fp8_e4m3"):
        return dtype, torch.float8_e4m3fn
    return dtype, resolve_dtype(config.kv_cache_dtype, device)


def load_rank_model(config: EngineConfig, device: torch.device, tp: TPGroup = SINGLE,
                    checkpoint: Checkpoint | None = None):  # fmt: skip
    """What every rank does: this rank's shard of the model, its dtypes and attention backend."""
    keep_freed_memory_in_heap()
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    checkpoint = checkpoint or open_checkpoint(config.model)
    scheme = weight_scheme(config, device, checkpoint, tp.world_size)
    dtype, kv_dtype = resolve_dtypes(config, device, scheme)
    backend = _attention_backend(config, device)
    if kv_dtype == torch.float8_e4m3fn and backend.name == "triton":
        raise ValueError("an fp8 KV cache needs --attention-backend torch or cpu (the Triton "
                         "kernels read bf16/fp16/fp32 caches)")  # fmt: skip
    model = load_model(checkpoint, dtype, device, config.quantization, tp, scheme=scheme)
    log.info("weights: %s; attention: %s", scheme.describe(), backend.name)
    return model, dtype, kv_dtype, backend


def _check_limits(config: EngineConfig) -> None:
    for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size",
                 "tensor_parallel_size"):  # fmt: skip
        _positive(name, getattr(config, name))
    if config.kv_cache_memory is not None and config.kv_cache_memory <= 0:
        raise ValueError(
            f"kv_cache_memory must be a positive number of bytes, got {config.kv_cache_memory}"
        )


def set_up_engine(config: EngineConfig) -> EngineSetup:
    t0 = time.monotonic()
    _check_limits(config)
    device = resolve_device(config.device)
    resolve_dtypes(config, device)  # fail on bad dtype flags before starting anything
    checkpoint = open_checkpoint(config.model)
    mc = checkpoint.config
    tp, control, procs = SINGLE, None, []
    if config.tensor_parallel_size > 1:
        from inferd.distributed.launch import start_ranks

        tp_shard(mc, config.tensor_parallel_size)  # heads must divide: say so before spawning
        tp, control, procs = start_ranks(config, device)
    try:
        return _set_up_rank0(config, device, checkpoint, tp, control, procs, t0)
    except BaseException:
        if procs or tp.enabled:
            from inferd.distributed.tp_runner import TPModelRunner

            TPModelRunner(None, control, procs).shutdown()
        raise


def _set_up_rank0(config, device, checkpoint, tp, control, procs, t0) -> EngineSetup:
    mc = checkpoint.config
    tokenizer = checkpoint.tokenizer()
    model, dtype, kv_dtype, backend = load_rank_model(config, device, tp, checkpoint)
    defaults = ENGINE_DEFAULTS["cuda" if device.type == "cuda" else "cpu"]
    max_num_seqs = config.max_num_seqs or defaults["max_num_seqs"]
    max_len = config.max_model_len or mc.max_position_embeddings
    if config.max_model_len and config.max_model_len > mc.max_position_embeddings:
        raise ValueError(
            f"max_model_len {config.max_model_len} exceeds the model's limit of "
            f"{mc.max_position_embeddings} positions"
        )
    batched = config.max_num_batched_tokens or defaults["max_num_batched_tokens"]
    budget = _kv_budget(config, device, model, max_num_seqs, batched, kv_dtype)
    # Every rank holds the same blocks, each for its own KV heads (tp_shard: this rank's slice).
    rank_config = tp_shard(mc, tp.world_size)
    plan = plan_kv_pool(rank_config, budget, config.block_size, kv_dtype.itemsize, max_num_seqs,
                        batched)  # fmt: skip
    if plan.token_capacity is not None and plan.token_capacity < max_len:
        if config.max_model_len:
            raise ValueError(
                f"max_model_len {max_len} does not fit the KV cache: kv_cache_memory holds "
                f"{plan.token_capacity} tokens; raise kv_cache_memory or lower max_model_len"
            )
        log.warning("max_model_len lowered from %d to %d to fit the KV cache", max_len,
                    plan.token_capacity)  # fmt: skip
        max_len = plan.token_capacity
    # lazy_zero: touching a GiB-sized pool at start-up costs seconds on CPU; the engine zeroes
    # each block on first use instead (KVCacheManager.take_fresh_blocks).
    runner = ModelRunner(model, plan.num_blocks, config.block_size, kv_dtype, device, backend,
                         lazy_zero=True)  # fmt: skip
    if tp.enabled:
        from inferd.distributed.tp_runner import TPModelRunner
        from inferd.distributed.worker import broadcast

        broadcast(plan.num_blocks, control)
        runner = TPModelRunner(runner, control, procs)
    elif device.type == "cuda" and not config.enforce_eager and backend.name == "triton":
        from inferd.engine.cuda_graphs import CUDAGraphDecoder

        graphs = CUDAGraphDecoder(runner, max_num_seqs, max_len)
        seconds = graphs.capture()
        runner.graphs = graphs
        log.warning("CUDA graphs captured for batch sizes up to %d in %.1f s",
                    graphs.sizes[-1], seconds)  # fmt: skip
    seconds = time.monotonic() - t0
    log.info("loaded %s (%s, %s, TP=%d) in %.2f s; KV pool %.1f MiB", checkpoint.display_name,
             device, dtype, tp.world_size, seconds, plan.total_bytes / 2**20)  # fmt: skip
    return EngineSetup(device, dtype, checkpoint, mc, tokenizer, runner, plan, max_len,
                       max_num_seqs, batched, seconds)  # fmt: skip

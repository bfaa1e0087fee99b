"""Start-up of rank 0: check the limits, start the tensor-parallel workers (if any), load the
tokenizer and this rank's model (`model_setup.py`), size the KV pool from the memory budget
(`kv_budget.py`), resolve the scheduler limits and build the runner. Also the model's identity
and description, built once for everything that reports them."""

from __future__ import annotations

import hashlib
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from inferd.config import ENGINE_DEFAULTS, EngineConfig, ModelConfig
from inferd.cpu_kernels.startup import prepare_cpu_kernels
from inferd.distributed.control import broadcast
from inferd.distributed.state import SINGLE
from inferd.engine.execution.lora_cache import AdapterCache
from inferd.engine.execution.model_setup import load_rank_model, resolve_dtypes, weight_scheme
from inferd.engine.execution.runner import ModelRunner
from inferd.engine.execution.tp_runner import TPModelRunner
from inferd.engine.execution.tp_workers import start_ranks
from inferd.engine.scheduling.kv_budget import check_kv_flags, kv_budget
from inferd.engine_client import ModelInfo
from inferd.layers.lora import attach_lora
from inferd.loader import Checkpoint, gguf_cache, open_checkpoint
from inferd.loader.checkpoint import gguf_file_of
from inferd.loader.pooler_config import pooler_config
from inferd.memory.gpu_budget import memory_in_use
from inferd.memory.kv import KVPoolPlan, kv_element, plan_kv_pool
from inferd.memory.weights import tp_shard
from inferd.platform import resolve_device
from inferd.tokenizer import Tokenizer, checkpoint_tokenizer
from inferd.version import __version__

log = logging.getLogger(__name__)


@dataclass
class EngineSetup:
    device: torch.device
    dtype: torch.dtype
    checkpoint: Checkpoint
    model_config: ModelConfig
    tokenizer: Tokenizer
    runner: ModelRunner | TPModelRunner
    kv_plan: KVPoolPlan
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    load_seconds: float


def model_identity(setup: EngineSetup, config: EngineConfig) -> str:
    """Which weights at which precision: equal identities compute equal keys and values."""
    return f"{setup.checkpoint.path}|{setup.dtype}|{config.quantization}"


def describe_model(setup: EngineSetup, config: EngineConfig) -> ModelInfo:
    display = setup.checkpoint.display_name
    ident = f"{__version__}|{model_identity(setup, config)}"
    pooling = pooler_config(setup.checkpoint, config.pooler_config)
    log.info("embeddings: %s", pooling.describe())
    return ModelInfo(
        name="-".join(display.lower().split()) or "inferd-model",
        display_name=display,
        max_model_len=setup.max_model_len,
        vocab_size=setup.model_config.vocab_size,
        fingerprint="fp_" + hashlib.sha256(ident.encode()).hexdigest()[:10],
        pooling=pooling,
    )


def _positive(name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_limits(config: EngineConfig) -> None:
    for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size",
                 "tensor_parallel_size", "max_n", "max_stop_strings",
                 "max_stop_string_length", "max_logprobs", "stream_interval"):  # fmt: skip
        _positive(name, getattr(config, name))
    if config.enable_lora:
        for name in ("max_loras", "max_lora_rank", "max_cpu_loras"):
            _positive(name, getattr(config, name))
        if config.max_cpu_loras is not None and config.max_cpu_loras < config.max_loras:
            raise ValueError(f"max_cpu_loras ({config.max_cpu_loras}) must be at least "
                             f"max_loras ({config.max_loras})")  # fmt: skip
        if config.tensor_parallel_size > 1:
            raise ValueError("enable_lora: LoRA adapters with tensor_parallel_size > 1 are not "
                             "supported")  # fmt: skip
    if config.kv_cache_memory is not None and config.kv_cache_memory <= 0:
        raise ValueError(
            f"kv_cache_memory must be a positive number of bytes, got {config.kv_cache_memory}"
        )


def set_up_engine(config: EngineConfig) -> EngineSetup:
    t0 = time.monotonic()
    _check_limits(config)
    device = resolve_device(config.device)
    resolve_dtypes(config, device)  # fail on bad dtype flags before starting anything
    check_kv_flags(config, device)
    if (early := gguf_file_of(config.model)) is not None:
        # NOTE: the blocks cached from a GGUF file are verified by a thread; it starts before
        # the file's header is read (its vocabulary alone takes a few hundredths of a second)
        # so that it is done when they are needed. Dropped below if the model keeps no blocks.
        gguf_cache.start_checking(early, 0, config.tensor_parallel_size)
    try:
        checkpoint = open_checkpoint(config.model)  # and on a bad model file
    except BaseException:
        if early is not None:
            gguf_cache.stop_checking(early, 0, config.tensor_parallel_size)
        raise
    # NOTE: the tokenizer loads in a thread while the C kernels are prepared: on a first run
    # both take seconds (deriving the tokenizer's tables is Python; compiling waits on compiler
    # processes, with Python's lock released), so they overlap.
    with ThreadPoolExecutor(1, thread_name_prefix="inferd-tokenizer") as pool:
        tokenizer = pool.submit(checkpoint_tokenizer, checkpoint)
        prepare_cpu_kernels(device)  # compiled now (or cached), never inside a request
        mc = checkpoint.config
        tp, control, procs = SINGLE, None, []
        if config.tensor_parallel_size > 1:
            tp_shard(mc, config.tensor_parallel_size)  # heads must divide: say so before spawning
            tp, control, procs = start_ranks(config, device)
        try:
            return _set_up_rank0(config, device, checkpoint, tokenizer, tp, control, procs, t0)
        except BaseException:
            if procs or tp.enabled:
                TPModelRunner(None, tp, control, procs).shutdown()
            raise


def _set_up_rank0(config, device, checkpoint, tokenizer: Future, tp, control, procs, t0
                  ) -> EngineSetup:  # fmt: skip
    mc = checkpoint.config
    if checkpoint.format == "gguf":
        # NOTE: the cached blocks' checksum (a few tenths of a second) runs in a thread while
        # the tokenizer loads: zlib releases Python's lock, `tokenizers` holds it.
        if weight_scheme(config, device, checkpoint, tp.world_size).blocks:
            gguf_cache.start_checking(checkpoint.path, tp.rank, tp.world_size)
        else:
            gguf_cache.stop_checking(checkpoint.path, tp.rank, tp.world_size)
    tokenizer = tokenizer.result()
    in_use_before = memory_in_use(device) if device.type == "cuda" else 0
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
    budget = kv_budget(config, device, model, max_num_seqs, batched, kv_dtype, in_use_before)
    # Every rank holds the same blocks, each for its own KV heads (tp_shard: this rank's slice).
    rank_config = tp_shard(mc, tp.world_size)
    plan = plan_kv_pool(rank_config, budget, config.block_size, kv_element(kv_dtype),
                        max_num_seqs, batched)  # fmt: skip
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
    # each block on first use instead (StepRecord.blocks_to_clear).
    runner = ModelRunner(model, plan.num_blocks, config.block_size, kv_dtype, device, backend,
                         lazy_zero=True)  # fmt: skip
    if config.enable_lora:
        attach_lora(model, config.max_loras, config.max_lora_rank)
        runner.adapter_cache = AdapterCache(config.max_cpu_loras or config.max_loras)
    if tp.enabled:
        broadcast(plan.num_blocks, control)
        runner = TPModelRunner(runner, tp, control, procs)
    elif (device.type == "cuda" and not config.enforce_eager and backend.name == "triton"
          and not config.enable_lora):  # NOTE: the graphs have no adapter rows  # fmt: skip
        from inferd.engine.execution.cuda_graphs import CUDAGraphDecoder

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

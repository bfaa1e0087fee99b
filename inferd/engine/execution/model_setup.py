"""What every rank does to get its model: resolve the dtypes of weights, activations and the KV
cache, pick the attention backend, open the checkpoint and load this rank's shard of the weights.
Rank 0 does it inside `setup.py`; tensor-parallel workers in `tp_workers.py`."""

from __future__ import annotations

import logging

import torch

from inferd.config import EngineConfig
from inferd.distributed.state import SINGLE, TPGroup
from inferd.kv_int8 import INT8_KV
from inferd.layers.weight_scheme import WeightScheme, choose_scheme, deterministic_scheme
from inferd.loader import Checkpoint, load_model, open_checkpoint
from inferd.platform import DTYPES, keep_freed_memory_in_heap, resolve_dtype
from inferd.progress import say

log = logging.getLogger(__name__)


ATTENTION_BACKENDS = ("auto", "torch", "cpu", "triton")
# --kv-cache-dtype: auto (the mode's), the dense dtypes (platform.DTYPES' aliases work too), fp8
# (e4m3) and int8 (a scale per token and KV head: inferd/kv_int8.py)
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "fp8", "int8")
FP8_NAMES = ("fp8", "fp8_e4m3")


def _attention_backend(config: EngineConfig, device: torch.device, fixed_order: bool):
    """`torch`: plain PyTorch anywhere (the reference); `cpu`: attention in C (`fixed_order`:
    every row, else decode rows, prefill chunks in PyTorch); `triton`: the GPU kernels. `auto`:
    triton on CUDA when installed, cpu on CPU when inferd's C kernels build, else torch."""
    from inferd.attention.torch_backend import TorchAttentionBackend

    choice = config.attention_backend
    if choice not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, "
                         f"got {choice!r}")  # fmt: skip
    if choice == "torch":
        return TorchAttentionBackend()
    if choice == "cpu" or (choice == "auto" and device.type == "cpu"):
        return _cpu_backend(choice, device, fixed_order) or TorchAttentionBackend()
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


def _cpu_backend(choice: str, device: torch.device, fixed_order: bool):
    from inferd.attention.cpu_backend import CpuAttentionBackend
    from inferd.cpu_kernels import KernelsUnavailable, kernel_library

    if device.type != "cpu":
        raise ValueError(f"attention_backend cpu runs on the CPU only, not on {device}")
    try:
        return CpuAttentionBackend(kernel_library(), fixed_order)
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
    scheme = choose_scheme(config.quantization, config.dtype,
                           checkpoint.format if checkpoint is not None else None, device,
                           tp_size, dict(config.defaults_from).get("dtype"),
                           checkpoint.quant if checkpoint is not None else None)  # fmt: skip
    if not config.deterministic:
        return scheme
    if config.attention_backend not in ("auto", "cpu"):
        raise ValueError(f"--deterministic needs the cpu attention backend (fixed-order "
                         f"attention in C), not {config.attention_backend}")  # fmt: skip
    if config.kv_cache_dtype in FP8_NAMES:
        raise ValueError("--deterministic needs a float32, bfloat16 or int8 KV cache (fp8 "
                         "caches are attended in PyTorch)")  # fmt: skip
    return deterministic_scheme(scheme, device, max(tp_size, config.tensor_parallel_size))


def resolve_dtypes(
    config: EngineConfig, device: torch.device, scheme: WeightScheme | None = None
) -> tuple[torch.dtype, torch.dtype]:
    """(weights/activations dtype, KV cache dtype) of the scheme (by default: of the flags
    alone, which checks them)."""
    scheme = scheme or weight_scheme(config, device, None)
    dtype = scheme.dtype
    name = config.kv_cache_dtype
    if name == "auto":
        return dtype, scheme.kv_cache_dtype
    if name in FP8_NAMES:
        return dtype, torch.float8_e4m3fn
    if name == "int8":
        return dtype, INT8_KV
    if name not in DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}; got "
                         f"{name!r}")  # fmt: skip
    if DTYPES[name] == torch.float16 and device.type == "cpu":
        raise ValueError("kv_cache_dtype float16 is not supported on CPU; use bfloat16, int8 "
                         "or float32")  # fmt: skip
    return dtype, resolve_dtype(name, device)


def load_rank_model(config: EngineConfig, device: torch.device, tp: TPGroup = SINGLE,
                    checkpoint: Checkpoint | None = None):  # fmt: skip
    """What every rank does: this rank's shard of the model, its dtypes and attention backend."""
    keep_freed_memory_in_heap()
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    checkpoint = checkpoint or open_checkpoint(config.model)
    scheme = weight_scheme(config, device, checkpoint, tp.world_size)
    dtype, kv_dtype = resolve_dtypes(config, device, scheme)
    # NOTE: fixed-order attention wherever rows must not depend on their step: the C decoder
    # layer of a block model reads its per-row plans (float32, bf16 and int8 caches: int8 rows
    # are quantised per token, whatever step writes them); --deterministic. Dense modes
    # otherwise attend prefill chunks with PyTorch's bf16 GEMMs (faster there).
    fixed_order = (scheme.blocks and kv_dtype != torch.float8_e4m3fn) or scheme.deterministic
    backend = _attention_backend(config, device, fixed_order)
    if kv_dtype == torch.float8_e4m3fn and backend.name == "triton":
        raise ValueError("an fp8 KV cache needs --attention-backend torch or cpu (the Triton "
                         "kernels read bf16, fp16, fp32 and int8 caches)")  # fmt: skip
    model = load_model(checkpoint, dtype, device, config.quantization, tp, scheme=scheme,
                       weight_cache_size=config.weight_cache_size)  # fmt: skip
    checkpoint.release_file_pages()  # the tokenizer (rank 0) and the weights are loaded
    if tp.rank == 0:  # the mode and why, said once at start-up like the kernels' line
        say(f"weights: {scheme.describe()}")
    log.info("weights: %s; attention: %s", scheme.describe(), backend.name)
    return model, dtype, kv_dtype, backend

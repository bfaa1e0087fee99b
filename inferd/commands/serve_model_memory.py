"""What one model of a server of many models takes in memory (server/multimodel/memory.py says
what the figure counts), for `--max-loaded-memory`.

Before a load, `estimate_model` reads the checkpoint's config and tensor headers (nothing is
loaded) and works out what the model's engine will allocate with the server's flags, with the
engine's own functions: the weight scheme and KV dtype (model_setup.py), the KV pool as
`plan_kv_pool` plans it from the KV budget (`--kv-cache-memory`, or the CPU default), and
`inferd memory`'s estimate
of the weights, the largest step's activations and the runtime overhead. After a load,
`measure_model` asks the engine what it holds (its snapshot: weights and KV pool).
"""

from __future__ import annotations

from pathlib import Path

from inferd.server.multimodel.memory import ModelMemory

_DENSE = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}
_KV = {**_DENSE, "torch.float8_e4m3fn": "fp8", "torch.int8": "int8"}


def estimate_model(config, data_parallel_size: int) -> ModelMemory:
    """`config`: the model's EngineConfig. Summed over its replicas and tensor-parallel ranks."""
    from inferd.config import ENGINE_DEFAULTS
    from inferd.engine.execution.model_setup import resolve_dtypes, weight_scheme
    from inferd.loader import open_checkpoint
    from inferd.memory.kv import kv_element, plan_kv_pool
    from inferd.memory.weights import tp_shard
    from inferd.platform import resolve_device

    device = resolve_device(config.device)
    kind = "cuda" if device.type == "cuda" else "cpu"
    tp = config.tensor_parallel_size
    processes = tp * data_parallel_size
    checkpoint = open_checkpoint(config.model)
    scheme = weight_scheme(config, device, checkpoint, tp)
    dtype, kv_dtype = resolve_dtypes(config, device, scheme)
    mc = checkpoint.config
    defaults = ENGINE_DEFAULTS[kind]
    max_num_seqs = config.max_num_seqs or defaults["max_num_seqs"]
    batched = config.max_num_batched_tokens or defaults["max_num_batched_tokens"]
    weights, runtime = _weights_and_runtime(config, checkpoint, kind, dtype, scheme, kv_dtype,
                                            max_num_seqs, batched)  # fmt: skip
    # NOTE: on a GPU the server refuses a budget without --kv-cache-memory (serve_models.py):
    # the engine would give its pool whatever --gpu-memory-utilization leaves.
    budget = config.kv_cache_memory or defaults.get("kv_cache_memory")
    if budget is None:
        raise ValueError("the KV pool's size is known before a load only with --kv-cache-memory")
    plan = plan_kv_pool(tp_shard(mc, tp), budget, config.block_size, kv_element(kv_dtype),
                        max_num_seqs, batched)  # fmt: skip
    kv_pool = plan.total_bytes
    return ModelMemory(weights * processes, kv_pool * processes, runtime * processes,
                       processes, measured=False, on_gpu=kind == "cuda")  # fmt: skip


def _attention(config, kind: str, scheme, kv_dtype) -> str:
    """How the engine's attention backend holds a step's scores, as the estimate names it:
    "fused" where no score matrix is made (Triton on a GPU; the C kernels for every row on a
    CPU, which model_setup.py picks for GGUF blocks and --deterministic), else "torch"."""
    import torch

    if kind == "cuda":
        return "torch" if config.attention_backend == "torch" else "fused"
    if config.attention_backend not in ("auto", "cpu"):
        return "torch"
    from inferd.cpu_kernels import kernels_available

    every_row = (scheme.blocks and kv_dtype != torch.float8_e4m3fn) or scheme.deterministic
    return "fused" if every_row and kernels_available() else "torch"


def _weights_and_runtime(config, checkpoint, kind: str, dtype, scheme, kv_dtype,
                         max_num_seqs: int, batched: int) -> tuple[int, int]:  # fmt: skip
    """(weights, activations + runtime overhead) of one process, as `inferd memory` estimates
    them for the engine's attention backend; where its estimate does not cover the settings,
    the checkpoint's size on disk and the overhead alone."""
    from inferd.memory.activations import runtime_overhead
    from inferd.memory.estimate import estimate_memory
    from inferd.memory.weights import checkpoint_weights

    name, block_kernels = _DENSE.get(str(dtype), "auto"), False
    if config.quantization in ("int8", "int4", "fp8"):
        name = config.quantization
    elif config.dtype == "auto" and config.quantization in (None, "gguf"):
        name, block_kernels = "auto", scheme.blocks
    mc = checkpoint.config
    max_len = min(config.max_model_len or mc.max_position_embeddings, mc.max_position_embeddings)
    try:
        est = estimate_memory(mc, dtype=name, kv_cache_dtype=_KV.get(str(kv_dtype), "auto"),
                              max_model_len=max_len, concurrency=max_num_seqs,
                              max_num_batched_tokens=batched,
                              tensor_parallel_size=config.tensor_parallel_size, device=kind,
                              attention_backend=_attention(config, kind, scheme, kv_dtype),
                              checkpoint=checkpoint_weights(checkpoint),
                              block_kernels=block_kernels)  # fmt: skip
    except ValueError:
        size = _size_on_disk(checkpoint.path) // config.tensor_parallel_size
        return size, runtime_overhead(kind).bytes
    device = est.per_device
    return device.weights, device.activations.peak_bytes + device.overhead.bytes


def _size_on_disk(path: str) -> int:
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())


async def measure_model(
    app, data_parallel_size: int, tensor_parallel_size: int
) -> ModelMemory | None:
    """What the loaded model's engine reports it holds (one replica's rank 0, times the
    processes: each holds the same), the runtime part from the engine's own prediction (the
    pool keeps the estimate's when it made one); None when its client cannot tell."""
    from inferd.engine_client import SnapshotClient
    from inferd.memory.activations import runtime_overhead

    client = app.state.inferd.client
    if not isinstance(client, SnapshotClient):
        return None
    memory = (await client.snapshot()).memory
    processes = data_parallel_size * tensor_parallel_size
    if memory.predicted is not None:
        runtime = memory.predicted.activations + memory.predicted.overhead
    else:
        runtime = runtime_overhead("cuda" if memory.device == "cuda" else "cpu").bytes
    return ModelMemory(memory.weights * processes, memory.kv_pool * processes,
                       runtime * processes, processes, measured=True,
                       on_gpu=memory.device == "cuda")  # fmt: skip

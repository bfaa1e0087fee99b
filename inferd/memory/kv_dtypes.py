"""What each KV cache dtype buys on one model: bytes per token, how many 4096-token contexts one
GiB holds, and how many requests at `max_model_len` fit the device with everything else the
estimate counts (weights, activations, runtime), by the same capacity search as the estimate's
own (`estimate_memory(...).max_concurrency`). int8 rows count their scales (inferd/kv_int8.py),
as the engine allocates them. `inferd memory` prints it as a table."""

from __future__ import annotations

from dataclasses import dataclass

from inferd.config import ModelConfig
from inferd.memory.estimate import KV_DTYPES, KV_ELEMENTS, estimate_memory
from inferd.memory.kv import kv_bytes_for_context
from inferd.memory.weights import tp_shard

GIB = 1 << 30
CONTEXT_4K = 4096


@dataclass(frozen=True)
class KVDtypeCapacity:
    kv_dtype: str
    bytes_per_token: int  # per device, every layer (no window cap)
    contexts_4k_per_gib: int  # 4096-token contexts in 1 GiB of KV (window-capped, per device)
    max_concurrency: int | None  # requests of max_model_len that fit the device; None: no memory
    runs_here: bool  # False: the engine refuses it on this device (float16 on CPU)


def kv_dtype_capacities(
    config: ModelConfig,
    *,
    max_model_len: int | None = None,
    device_memory: int | None = None,
    **settings,
) -> list[KVDtypeCapacity]:
    """One row per KV dtype; `settings`: estimate_memory's other arguments (kv_cache_dtype is
    set per row)."""
    settings.pop("kv_cache_dtype", None)
    shard = tp_shard(config, settings.get("tensor_parallel_size", 1))
    rows = []
    for kv in KV_DTYPES:
        est = estimate_memory(config, kv_cache_dtype=kv, max_model_len=max_model_len,
                              device_memory=device_memory, **settings)  # fmt: skip
        context = kv_bytes_for_context(shard, min(CONTEXT_4K, config.max_position_embeddings),
                                       KV_ELEMENTS[kv])  # fmt: skip
        rows.append(KVDtypeCapacity(
            kv, est.kv_bytes_per_token_per_device, GIB // context, est.max_concurrency,
            runs_here=not (kv == "fp16" and est.device == "cpu"),
        ))  # fmt: skip
    return rows

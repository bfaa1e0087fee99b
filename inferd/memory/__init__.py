"""Memory accounting: what a model costs (weights, KV cache, activations, overhead).

    from inferd.memory import estimate_memory
    est = estimate_memory(config, dtype="bf16", device="cuda", max_model_len=8192,
                          concurrency=16, device_memory=80 * 2**30)
    est.per_device.total, est.fits, est.max_concurrency, est.min_tensor_parallel_size

Nothing here imports torch: estimates work from a config alone.
"""

from inferd.memory.activations import ActivationEstimate, estimate_activations, runtime_overhead
from inferd.memory.estimate import MemoryEstimate, engine_kv_pool, estimate_memory
from inferd.memory.kv import (
    KVElement,
    KVPoolPlan,
    kv_bytes_for_context,
    kv_bytes_per_token,
    kv_bytes_per_token_per_layer,
    plan_kv_pool,
)
from inferd.memory.kv_dtypes import KVDtypeCapacity, kv_dtype_capacities
from inferd.memory.measure import measure_memory
from inferd.memory.weights import (
    CheckpointWeights,
    ParamCounts,
    checkpoint_weights,
    count_parameters,
    tp_shard,
    weight_bytes,
    weight_bytes_by_precision,
)

__all__ = [
    "ActivationEstimate",
    "CheckpointWeights",
    "KVDtypeCapacity",
    "KVElement",
    "KVPoolPlan",
    "MemoryEstimate",
    "ParamCounts",
    "checkpoint_weights",
    "count_parameters",
    "engine_kv_pool",
    "estimate_activations",
    "estimate_memory",
    "kv_bytes_for_context",
    "kv_bytes_per_token",
    "kv_bytes_per_token_per_layer",
    "kv_dtype_capacities",
    "measure_memory",
    "plan_kv_pool",
    "runtime_overhead",
    "tp_shard",
    "weight_bytes",
    "weight_bytes_by_precision",
]

"""The whole estimate, per device:

    required ≈ weights + KV cache + activations/temporaries + runtime overhead

and capacity planning on top of it: does it fit `device_memory`, the largest concurrency at a
context length (and the longest context at a concurrency) that fits, and the smallest
tensor-parallel size that fits. KV figures come from `inferd.memory.kv`, the functions the engine
sizes its pool with: the formula (`kv_bytes_for_context`) and the pool the engine really
allocates for it (`plan_kv_pool`: whole blocks, a null block, a window reserve per sequence).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from inferd.config import ENGINE_DEFAULTS, ModelConfig
from inferd.memory.activations import (
    ActivationEstimate,
    Term,
    estimate_activations,
    runtime_overhead,
)
from inferd.memory.kv import (
    INT8_ROWS,
    KVElement,
    KVPoolPlan,
    kv_bytes_for_context,
    kv_bytes_per_token,
    kv_bytes_per_token_per_layer,
    plan_kv_pool,
)
from inferd.memory.weight_plan import (
    WeightPlan,
    block_plan,
    dense_plan,
    keeps_blocks,
    stored_plan,
)
from inferd.memory.weights import (
    CheckpointWeights,
    ParamCounts,
    canonical_precision,
    compute_dtype,
    count_parameters,
    decode_read_params,
    experts_read_fraction,
    resolve_dtype,
    tp_shard,
    valid_tp_sizes,
    weight_bytes,
    weight_bytes_by_precision,
)

DEFAULT_BLOCK_SIZE = 16
# The engine's step token budgets: a CPU step of 1024 tokens already takes seconds.
# The engine's own defaults (one place: inferd.config).
DEFAULT_MAX_NUM_BATCHED_TOKENS = {
    d: v["max_num_batched_tokens"] for d, v in ENGINE_DEFAULTS.items()
}
KV_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8")
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
# What a KV dtype stores per value and per row: int8 rows also hold their scale, as the runner
# allocates them (inferd/kv_int8.py).
KV_ELEMENTS = {"fp32": KVElement(4), "bf16": KVElement(2), "fp16": KVElement(2),
               "fp8": KVElement(1), "int8": INT8_ROWS}  # fmt: skip


def engine_kv_pool(
    config: ModelConfig,
    concurrency: int,
    context_len: int,
    *,
    dtype_bytes: int | KVElement,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS["cpu"],
) -> KVPoolPlan:
    """The smallest pool `plan_kv_pool` plans that holds `concurrency` sequences of
    `context_len` tokens each, with `max_num_seqs = concurrency`."""
    need = concurrency * math.ceil(context_len / block_size) * block_size

    def plan(budget: int) -> KVPoolPlan | None:
        try:
            return plan_kv_pool(
                config, budget, block_size, dtype_bytes, concurrency, max_num_batched_tokens
            )
        except ValueError:  # not even one block per group
            return None

    # Every group holding need/block + 1 blocks is always enough.
    hi = (need // block_size + 1) * block_size * kv_bytes_per_token(config, dtype_bytes)
    top = plan(hi)
    assert top is not None
    if top.token_capacity is None:
        # Only sliding layers: the pool stops growing at the window reserve, which already
        # holds sequences of any length.
        return top
    lo = 1
    while lo < hi:
        mid = (lo + hi) // 2
        p = plan(mid)
        fits = p is not None and p.token_capacity is not None and p.token_capacity >= need
        lo, hi = (lo, mid) if fits else (mid + 1, hi)
    return plan(lo)  # type: ignore[return-value]


@dataclass(frozen=True)
class DeviceBreakdown:
    """What one device (tensor-parallel rank) holds."""

    weights: int
    kv_formula: int  # concurrency × kv_bytes_for_context: the lower bound
    kv_pool: KVPoolPlan  # what the engine allocates to hold the same
    activations: ActivationEstimate
    overhead: Term

    @property
    def kv_cache(self) -> int:
        return self.kv_pool.total_bytes

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activations.peak_bytes + self.overhead.bytes


@dataclass(frozen=True)
class MemoryEstimate:
    name: str
    device: str
    dtype: str
    kv_cache_dtype: str
    tensor_parallel_size: int
    max_model_len: int
    concurrency: int
    max_num_batched_tokens: int
    block_size: int
    attention_backend: str
    params: ParamCounts  # the whole model
    params_per_device: int
    checkpoint: CheckpointWeights | None  # None: config only
    weights_by_precision: dict[str, int]  # the whole model
    kv_bytes_per_token_per_layer: int  # the whole model
    kv_bytes_per_token: int  # the whole model, every layer full attention (no window cap)
    kv_bytes_per_token_per_device: int
    kv_bytes_per_request: int  # per device, one request at max_model_len, window-capped
    kv_bytes_per_request_uncapped: int  # per device, as if no layer had a window
    per_device: DeviceBreakdown
    device_memory: int | None = None
    max_concurrency: int | None = None  # at max_model_len, on device_memory
    max_context: int | None = None  # at concurrency, on device_memory
    min_tensor_parallel_size: int | None = None  # smallest that fits, None when none does
    weight_plan: WeightPlan | None = None  # the mode's weights (whole model; weight_plan.py)
    # Weight bytes one device reads per decode step, by the step's sequences (1 and the
    # concurrency): decode is bound by these reads (weights.decode_read_params).
    decode_read_bytes: dict[int, int] = field(default_factory=dict)

    @property
    def fits(self) -> bool | None:
        if self.device_memory is None:
            return None
        return self.per_device.total <= self.device_memory

    def to_dict(self) -> dict:
        """JSON-ready: every figure in bytes (or counts), derived totals included."""
        return plain(self)


# Properties worth a key of their own in `to_dict`.
_DERIVED = ("total", "active", "per_layer", "bits_per_weight", "total_bytes", "kv_cache",
            "peak_bytes", "peak_phase", "fits")  # fmt: skip


def plain(obj: Any) -> Any:
    """Dataclasses → dicts (with their derived properties), tuples → lists."""
    if is_dataclass(obj):
        out = {f.name: plain(getattr(obj, f.name)) for f in fields(obj)}
        out.update({k: plain(getattr(obj, k)) for k in _DERIVED if hasattr(obj, k)})
        return out
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain(v) for v in obj]
    return obj


@dataclass(frozen=True)
class _Plan:
    """The settings an estimate is made under; `device_bytes` evaluates one device for them."""

    config: ModelConfig
    dtype: str
    kv_dtype: str
    max_num_batched_tokens: int
    block_size: int
    device: str
    attention_backend: str
    blocks: WeightPlan | None = None  # the default mode's GGUF blocks (no tensor parallelism)

    def device_bytes(self, tp: int, concurrency: int, context_len: int) -> DeviceBreakdown:
        shard = tp_shard(self.config, tp)
        tokens, kvb = self.max_num_batched_tokens, KV_ELEMENTS[self.kv_dtype]
        weights = weight_bytes(count_parameters(shard).total, self.dtype)
        if self.blocks is not None and tp == 1:
            weights = self.blocks.total
        acts = estimate_activations(
            shard,
            num_tokens=tokens,
            num_seqs=min(concurrency, tokens),  # a step samples at most one row per token
            context_len=context_len,
            # block layers take and give float32 activations (the residual stream is float32)
            act_bytes=4 if self.blocks is not None else ELEMENT_BYTES[compute_dtype(self.dtype)],
            vocab_size=self.config.vocab_size,
            attention_backend=self.attention_backend,
        )
        return DeviceBreakdown(
            weights=weights,
            kv_formula=concurrency * kv_bytes_for_context(shard, context_len, kvb),
            kv_pool=engine_kv_pool(
                shard,
                concurrency,
                context_len,
                dtype_bytes=kvb,
                block_size=self.block_size,
                max_num_batched_tokens=tokens,
            ),
            activations=acts,
            overhead=runtime_overhead(self.device),
        )


def _largest(fits: Callable[[int], bool], hi: int) -> int:
    """The largest n in [0, hi] with fits(n), for fits monotone decreasing; 0 when none."""
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def estimate_memory(
    config: ModelConfig,
    *,
    dtype: str = "auto",
    kv_cache_dtype: str = "auto",
    max_model_len: int | None = None,
    concurrency: int = 1,
    max_num_batched_tokens: int | None = None,
    tensor_parallel_size: int = 1,
    device: str = "cpu",
    device_memory: int | None = None,
    attention_backend: str | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    checkpoint: CheckpointWeights | None = None,
    name: str = "",
    block_kernels: bool = False,
) -> MemoryEstimate:
    """Estimate what `config` needs per device; with `device_memory` (bytes), also what fits.

    `dtype`: the precision the weights are held in ("auto": the engine's default for
    `device`: on a CPU where inferd's C kernels run (`block_kernels`), a GGUF checkpoint keeps
    its blocks, weight_plan.py); `kv_cache_dtype` ("auto": the compute dtype, bfloat16 with
    blocks, as WeightScheme.kv_cache_dtype); `concurrency` requests of
    `max_model_len` tokens (default: the model's limit); `max_num_batched_tokens` is the step's
    token budget, which sizes the activations. `attention_backend` defaults to the reference
    "torch" backend on CPU and a "fused" kernel on GPU.
    """
    runtime_overhead(device)  # validates the device name
    max_len = config.max_position_embeddings if max_model_len is None else max_model_len
    tokens = max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS[device]
    checks = dict(concurrency=concurrency, block_size=block_size, max_model_len=max_len,
                  tensor_parallel_size=tensor_parallel_size, max_num_batched_tokens=tokens,
                  device_memory=1 if device_memory is None else device_memory)  # fmt: skip
    for pname, value in checks.items():
        if value < 1:
            raise ValueError(f"{pname} must be >= 1 (got {value})")
    if max_len > config.max_position_embeddings:
        raise ValueError(
            f"max_model_len {max_len} exceeds the model's limit of "
            f"{config.max_position_embeddings} positions"
        )
    wdtype = resolve_dtype(dtype, device)
    tp = tensor_parallel_size
    blocks = None
    if checkpoint is not None and checkpoint.quant is not None:
        if device != "cpu" or tp != 1:
            raise ValueError(f"a {checkpoint.quant.name} checkpoint runs on one CPU device in "
                             "inferd (its weights as stored)")  # fmt: skip
        blocks = stored_plan(checkpoint)
        wdtype = blocks.compute_dtype
    elif keeps_blocks(dtype, device, checkpoint, tp, block_kernels):
        blocks = block_plan(checkpoint)  # type: ignore[arg-type]
        wdtype = blocks.compute_dtype
    kv_dtype = "bf16" if blocks is not None else compute_dtype(wdtype)
    if kv_cache_dtype != "auto":
        kv_dtype = canonical_precision(kv_cache_dtype)
    if kv_dtype not in KV_DTYPES:
        raise ValueError(
            f"kv_cache_dtype must be one of auto, {', '.join(KV_DTYPES)} (got {kv_cache_dtype!r})"
        )
    backend = attention_backend or ("torch" if device == "cpu" else "fused")
    plan = _Plan(config, wdtype, kv_dtype, tokens, block_size, device, backend, blocks)
    shard = tp_shard(config, tp)
    kvb = KV_ELEMENTS[kv_dtype]
    params = count_parameters(config)

    capacity: dict = {}
    if device_memory is not None:
        mem = device_memory

        def fits(n_tp: int, c: int, length: int) -> bool:
            return plan.device_bytes(n_tp, c, length).total <= mem

        per_request = kv_bytes_for_context(shard, max_len, kvb)
        capacity["max_concurrency"] = _largest(
            lambda c: fits(tp, c, max_len), mem // per_request + 1
        )
        capacity["max_context"] = _largest(
            lambda n: fits(tp, concurrency, n), config.max_position_embeddings
        )
        capacity["min_tensor_parallel_size"] = next(
            (n for n in valid_tp_sizes(config) if fits(n, concurrency, max_len)), None
        )

    weight_plan = blocks or dense_plan(params.total, wdtype)
    shard_params = count_parameters(shard)
    # Decode reads the weights as held (a GGUF file's blocks, not their bf16 copy), at the mode's
    # average bytes per weight.
    held = blocks.held if blocks is not None else weight_bytes(shard_params.total, wdtype)
    decode_reads = {}
    for batch in sorted({1, concurrency}):
        read = decode_read_params(shard, shard_params, batch, experts_read_fraction(config, batch))
        decode_reads[batch] = round(held * read / shard_params.total)
    return MemoryEstimate(
        name=name or config.name,
        device=device,
        dtype=wdtype,
        kv_cache_dtype=kv_dtype,
        tensor_parallel_size=tp,
        max_model_len=max_len,
        concurrency=concurrency,
        max_num_batched_tokens=tokens,
        block_size=block_size,
        attention_backend=backend,
        params=params,
        params_per_device=shard_params.total,
        checkpoint=checkpoint,
        weights_by_precision=weight_bytes_by_precision(params.total),
        kv_bytes_per_token_per_layer=kv_bytes_per_token_per_layer(config, kvb),
        kv_bytes_per_token=kv_bytes_per_token(config, kvb),
        kv_bytes_per_token_per_device=kv_bytes_per_token(shard, kvb),
        kv_bytes_per_request=kv_bytes_for_context(shard, max_len, kvb),
        kv_bytes_per_request_uncapped=kv_bytes_per_token(shard, kvb) * max_len,
        per_device=plan.device_bytes(tp, concurrency, max_len),
        device_memory=device_memory,
        weight_plan=weight_plan,
        decode_read_bytes=decode_reads,
        **capacity,
    )

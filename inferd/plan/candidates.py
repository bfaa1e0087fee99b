"""The configurations a plan weighs: each weight precision the hardware runs, times each way of
spreading the model over the devices (tensor parallel TP, pipeline parallel PP, expert parallel
EP for a Mixture of Experts, data-parallel replicas DP), with what one device holds. Every memory
figure is inferd.memory's estimate (`inferd memory`), the same the engine sizes itself by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferd.memory.estimate import KV_ELEMENTS, MemoryEstimate, estimate_memory
from inferd.memory.weights import count_parameters, tp_shard, valid_tp_sizes
from inferd.plan.model_facts import ModelFacts
from inferd.plan.roofline import ModelSlice

# The compute rate a dense precision runs its matrices at, on a part with that matrix unit
# (else bf16: weight-only quantisation dequantises to bf16 before the product).
RATE_OF = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "fp8",
           "int8": "int8", "int4": "bfloat16"}  # fmt: skip
GPU_PRECISIONS = ("bf16", "fp8", "int8", "int4")
CPU_PROFILE_PRECISIONS = ("bf16", "int8", "int4")
THIS_MACHINE_PRECISIONS = ("fp32", "bf16")  # dense, besides a GGUF file's own blocks ("gguf")


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1  # expert parallel (a Mixture of Experts' experts spread over the tp ranks)

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.dp

    def label(self) -> str:
        parts = [f"TP={self.tp}"]
        if self.ep > 1:
            parts.append(f"EP={self.ep}")
        parts += [f"PP={self.pp}", f"DP={self.dp}"]
        return " ".join(parts)


@dataclass(frozen=True)
class DeviceMemory:
    """What one device holds (bytes), from inferd.memory's estimate (pipeline stages split the
    layers, so their weights and KV)."""

    weights: int
    kv_cache: int
    activations: int
    runtime: int
    capacity: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activations + self.runtime

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity


@dataclass(frozen=True)
class Candidate:
    precision: str  # "gguf" (a GGUF file's own blocks, this machine's default), "bf16", ...
    layout: Layout
    estimate: MemoryEstimate  # one tensor-parallel rank, the whole depth
    memory: DeviceMemory  # one device
    slice: ModelSlice
    kv_bytes_per_request: int  # one device, at the workload's context
    max_concurrency: int  # per replica, at the workload's context, in memory

    @property
    def name(self) -> str:
        return f"{self.precision} {self.layout.label()}"


def precisions_for(kind: str, peaks_flops: dict, facts: ModelFacts, this: bool,
                   block_kernels: bool) -> list[str]:  # fmt: skip
    if this:
        blocks = ["gguf"] if facts.format == "gguf" and block_kernels else []
        return blocks + list(THIS_MACHINE_PRECISIONS)
    if kind == "cpu":
        return list(CPU_PROFILE_PRECISIONS)
    return [p for p in GPU_PRECISIONS if p != "fp8" or "fp8" in peaks_flops]


def layouts_for(facts: ModelFacts, devices: int) -> list[Layout]:
    """Every (TP, PP, DP) with TP x PP x DP = devices and a TP the model's heads divide by."""
    tps = [t for t in valid_tp_sizes(facts.config) if devices % t == 0]
    out = []
    for tp in tps:
        for pp in range(1, devices // tp + 1):
            if (devices // tp) % pp or pp > facts.config.num_layers:
                continue
            ep = tp if facts.config.moe is not None and tp > 1 else 1
            out.append(Layout(tp, pp, devices // (tp * pp), ep))
    return out


def rate_key(precision: str, peaks_flops: dict) -> str:
    key = RATE_OF.get(precision, "bfloat16")
    if key not in peaks_flops and key in ("fp8", "int8"):
        return "bfloat16"
    return key


def _checkpoint_for(facts: ModelFacts, device: str):
    """The stored weights where the plan runs them as stored; on a GPU a pre-quantised HF
    checkpoint (AWQ, GPTQ, ...) is planned from its config, at the precisions weighed there."""
    ckpt = facts.checkpoint
    if ckpt is not None and device != "cpu" and getattr(ckpt, "quant", None) is not None:
        return None
    return ckpt


def build_candidate(facts: ModelFacts, precision: str, layout: Layout, *, device: str,
                    capacity: int, context: int, concurrency: int, peaks_flops: dict,
                    max_num_batched_tokens: int | None = None,
                    kv_cache_dtype: str = "auto") -> Candidate:  # fmt: skip
    """One configuration: its memory per device at `concurrency` requests of `context` tokens
    per replica, and its slice of the model for the step model."""
    config = facts.config
    dtype = "auto" if precision == "gguf" else precision
    per_replica = max(math.ceil(concurrency / layout.dp), 1)
    est = estimate_memory(
        config,
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        max_model_len=context,
        concurrency=per_replica,
        max_num_batched_tokens=max_num_batched_tokens,
        tensor_parallel_size=layout.tp,
        device=device,
        checkpoint=_checkpoint_for(facts, device),
        name=facts.name,
        block_kernels=precision == "gguf",
    )
    pp = layout.pp
    d = est.per_device
    # a pipeline stage holds its layers' weights and KV, and the head (the last stage's): the
    # whole head is counted on every stage, the figure of the fullest one
    head = config.vocab_size * config.hidden_size / layout.tp
    shard = tp_shard(config, layout.tp)
    counts = count_parameters(shard)
    bytes_per_param = d.weights / max(counts.total, 1)
    head_bytes = round(head * bytes_per_param)
    weights = (d.weights - head_bytes) // pp + head_bytes if pp > 1 else d.weights
    memory = DeviceMemory(weights, d.kv_cache // pp, d.activations.peak_bytes, d.overhead.bytes,
                          capacity)  # fmt: skip
    matrices = counts.attention + counts.mlp - counts.experts + counts.experts_per_token
    if precision == "gguf" and facts.layer_formats:
        whole = sum(facts.layer_formats.values())
        layer_params = {f: matrices * n / whole / pp for f, n in facts.layer_formats.items()}
        head_format = facts.head_format
    else:
        key = rate_key(precision, peaks_flops)
        layer_params, head_format = {key: matrices / pp}, key
    attention_format = "float32" if device == "cpu" and precision in ("gguf", "fp32") else (
        "bfloat16")  # fmt: skip
    kv_element = KV_ELEMENTS[est.kv_cache_dtype]
    model_slice = ModelSlice(config, shard, layer_params, head, head_format, bytes_per_param,
                             kv_element, attention_format, layout.tp, pp)  # fmt: skip
    # the largest concurrency per replica whose KV fits beside the rest
    free = capacity - weights - d.activations.peak_bytes - d.overhead.bytes
    per_request = max(est.kv_bytes_per_request // pp, 1)
    max_c = max(free // per_request, 0) if free > 0 else 0
    return Candidate(precision, layout, est, memory, model_slice, per_request, int(max_c))


def default_mode_slice(facts: ModelFacts, peaks, block_kernels: bool, context: int = 1024):
    """The slice of `facts` that inferd's engine runs on this CPU by default: a GGUF file's
    own blocks where the C kernels run, else the default dtype (resolve_dtype's)."""
    from inferd.memory.weights import resolve_dtype

    precision = "gguf" if facts.format == "gguf" and block_kernels else resolve_dtype("auto", "cpu")
    context = min(context, facts.config.max_position_embeddings)
    c = build_candidate(facts, precision, Layout(), device="cpu", capacity=peaks.memory_bytes,
                        context=context, concurrency=1, peaks_flops=peaks.flops_s)  # fmt: skip
    return c.slice

"""Weight memory: exact parameter counts from a `ModelConfig`, what the checkpoint's tensors say,
and bytes by precision.

    weight bytes = parameters × bits per weight / 8

The count follows the modules inferd builds (fused q/k/v and gate/up change the layout, not the
count), so it equals `sum(p.numel() for p in model.parameters())` of a loaded model. A tied LM
head reads the embedding matrix and is counted once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from inferd.config import ModelConfig

if TYPE_CHECKING:
    from inferd.loader.checkpoint import Checkpoint

# Bits per weight of the precisions a plan is made for. These are the ideal figures: real
# quantised formats add scales (GGUF Q4_K is 4.5 bits, Q8_0 8.5 bits per weight).
PRECISION_BITS: dict[str, int] = {
    "fp32": 32,
    "bf16": 16,
    "fp16": 16,
    "fp8": 8,
    "int8": 8,
    "int4": 4,
}
PRECISION_ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}

# Gemma 3 wraps both attention and MLP in sandwich norms (before and after each).
_NORMS_PER_LAYER = {"gemma3": 4}
_DEFAULT_NORMS_PER_LAYER = 2  # pre-attention and pre-MLP

# Element sizes of safetensors dtypes (header strings).
_SAFETENSORS_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
}  # fmt: skip


def canonical_precision(name: str) -> str:
    """'bfloat16' → 'bf16', ...; raises ValueError naming the accepted spellings."""
    key = PRECISION_ALIASES.get(name.lower(), name.lower())
    if key not in PRECISION_BITS:
        accepted = ", ".join([*PRECISION_BITS, *PRECISION_ALIASES])
        raise ValueError(f"unknown precision {name!r}; accepted: {accepted}")
    return key


def weight_bytes(num_params: int, precision: str) -> int:
    """Bytes of `num_params` weights stored at `precision` (int4: two weights per byte)."""
    return math.ceil(num_params * PRECISION_BITS[canonical_precision(precision)] / 8)


def weight_bytes_by_precision(num_params: int) -> dict[str, int]:
    return {p: weight_bytes(num_params, p) for p in PRECISION_BITS}


def resolve_dtype(dtype: str, device: str) -> str:
    """'auto' as the engine resolves it (`inferd.cpu_info`): bf16 on GPUs and on CPUs with fast
    bf16, else float32. GGUF weights are dequantised to this dtype at load."""
    if dtype != "auto":
        return canonical_precision(dtype)
    if device == "cpu":
        from inferd.cpu_info import default_cpu_dtype

        return canonical_precision(default_cpu_dtype())
    return "bf16"


def compute_dtype(dtype: str) -> str:
    """Activations run in the weights' dtype; weight-only quantised layers compute in bf16."""
    return dtype if dtype in ("fp32", "bf16", "fp16") else "bf16"


@dataclass(frozen=True)
class ParamCounts:
    """Parameters by part of the model. `lm_head` is 0 when it is tied to the embedding."""

    embedding: int
    attention: int  # all layers: q/k/v/o projections, their biases, q/k norms
    mlp: int  # all layers: gate, up, down
    layer_norms: int  # all layers
    final_norm: int
    lm_head: int
    num_layers: int

    @property
    def total(self) -> int:
        return (
            self.embedding
            + self.attention
            + self.mlp
            + self.layer_norms
            + self.final_norm
            + self.lm_head
        )

    @property
    def per_layer(self) -> int:
        return (self.attention + self.mlp + self.layer_norms) // max(self.num_layers, 1)


def attention_params_per_layer(config: ModelConfig) -> int:
    hd, h = config.head_dim, config.hidden_size
    q, kv = config.num_heads * hd, config.num_kv_heads * hd
    n = h * (q + 2 * kv) + q * h  # q, k, v and the output projection
    if config.attention_bias:
        n += q + 2 * kv  # Qwen2: biases on q, k and v only
    if config.qk_norm:
        n += 2 * hd  # one RMSNorm gain over each head of q and of k, shared by the heads
    return n


def mlp_params_per_layer(config: ModelConfig) -> int:
    # Every supported architecture has a gated MLP: gate and up (hidden → inter), down back.
    return 3 * config.hidden_size * config.intermediate_size


def count_parameters(config: ModelConfig) -> ParamCounts:
    layers, h = config.num_layers, config.hidden_size
    norms = _NORMS_PER_LAYER.get(config.architecture, _DEFAULT_NORMS_PER_LAYER)
    embedding = config.vocab_size * h
    return ParamCounts(
        embedding=embedding,
        attention=layers * attention_params_per_layer(config),
        mlp=layers * mlp_params_per_layer(config),
        layer_norms=layers * norms * h,
        final_norm=h,
        lm_head=0 if config.tie_word_embeddings else embedding,
        num_layers=layers,
    )


def tp_shard(config: ModelConfig, tp: int) -> ModelConfig:
    """The slice of the model one of `tp` tensor-parallel ranks holds, as a config.

    Query heads, the MLP's intermediate size and the vocabulary (embedding and LM head) are split
    across ranks; norms are replicated. KV heads are split when there are at least `tp` of them,
    and otherwise replicated so that every rank holds one (its query heads need a KV head). The
    KV formulas of `inferd.memory.kv` applied to this config give per-rank KV bytes.
    """
    if tp < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1 (got {tp})")
    if tp == 1:
        return config
    heads, kv = config.num_heads, config.num_kv_heads
    if heads % tp:
        raise ValueError(
            f"tensor_parallel_size {tp} must divide the model's {heads} attention heads"
        )
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        raise ValueError(
            f"tensor_parallel_size {tp} must divide the model's {kv} KV heads or be a multiple "
            "of them"
        )
    return config.with_overrides(
        num_heads=heads // tp,
        num_kv_heads=max(kv // tp, 1),
        # Uneven splits are padded up, so the largest rank is the one that must fit.
        intermediate_size=math.ceil(config.intermediate_size / tp),
        vocab_size=math.ceil(config.vocab_size / tp),
    )


def valid_tp_sizes(config: ModelConfig) -> list[int]:
    out = []
    for n in range(1, config.num_heads + 1):
        try:
            tp_shard(config, n)
        except ValueError:
            continue
        out.append(n)
    return out


@dataclass(frozen=True)
class CheckpointWeights:
    """What the checkpoint's tensor directory says (GGUF tensor infos or safetensors headers)."""

    format: str  # "gguf" or "safetensors"
    num_params: int  # parameters of the model, counted from the stored tensor shapes
    stored_params: int  # every stored element (a tied checkpoint may also store the head)
    data_bytes: int  # tensor data as stored
    file_bytes: int  # the files, headers and metadata included
    by_type: dict[str, tuple[int, int]] = field(default_factory=dict)  # type → (params, bytes)

    @property
    def bits_per_weight(self) -> float:
        return self.data_bytes * 8 / self.stored_params if self.stored_params else 0.0


def checkpoint_weights(checkpoint: Checkpoint) -> CheckpointWeights | None:
    """Counts from the tensor directory alone (nothing is loaded); None for a folder that holds
    only a config.json."""
    config = checkpoint.config
    if checkpoint.gguf is not None:
        from inferd.loader.gguf_model import gguf_parameter_bytes, gguf_parameter_count
        from inferd.loader.gguf_quants import type_name

        by_type: dict[str, tuple[int, int]] = {}
        stored = 0
        for info in checkpoint.gguf.tensors.values():
            n = math.prod(info.shape)
            stored += n
            params, nbytes = by_type.get(type_name(info.ggml_type), (0, 0))
            by_type[type_name(info.ggml_type)] = (params + n, nbytes + info.n_bytes)
        return CheckpointWeights(
            format="gguf",
            num_params=gguf_parameter_count(checkpoint.gguf),
            stored_params=stored,
            data_bytes=gguf_parameter_bytes(checkpoint.gguf),
            file_bytes=Path(checkpoint.gguf.path).stat().st_size,
            by_type=by_type,
        )
    from inferd.loader.hf_dir import hf_tensor_shapes, safetensors_files

    shapes = hf_tensor_shapes(checkpoint.path)
    if not shapes:
        return None
    by_type = {}
    params = stored = data = 0
    for name, (shape, dtype) in shapes.items():
        n = math.prod(shape)
        nbytes = n * _SAFETENSORS_BYTES.get(dtype.upper(), 4)
        stored, data = stored + n, data + nbytes
        p, b = by_type.get(dtype, (0, 0))
        by_type[dtype] = (p + n, b + nbytes)
        # Buffers and a tied head's stored copy are not parameters of the model.
        if name.endswith("rotary_emb.inv_freq"):
            continue
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        params += n
    files = safetensors_files(checkpoint.path)
    return CheckpointWeights(
        format="safetensors",
        num_params=params,
        stored_params=stored,
        data_bytes=data,
        file_bytes=sum(f.stat().st_size for f in files),
        by_type=by_type,
    )

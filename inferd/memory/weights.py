"""Weight memory: exact parameter counts from a `ModelConfig`, what the checkpoint's tensors say,
and bytes by precision.

    weight bytes = parameters × bits per weight / 8

The count follows the tensors the family's Architecture record lists per layer (inferd/models/:
attention, norms, a dense MLP or a Mixture of Experts), so it equals
`sum(p.numel() for p in model.parameters())` of a loaded model (fused q/k/v and gate/up, stacked
experts change the layout, not the count). A tied LM head reads the embedding matrix and is
counted once.

A Mixture of Experts holds every expert but runs only `top_k` of them per token: its *active*
parameters are what one token's computation touches, and what a decode step of one sequence
reads; a step of several sequences reads the union of their experts (`decode_read_params`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from inferd.config import ModelConfig
from inferd.models.architecture import is_expert_tensor
from inferd.models.registry import architecture

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
    mlp: int  # all layers: gate, up, down; a Mixture of Experts' router, experts, shared expert
    layer_norms: int  # all layers
    final_norm: int
    lm_head: int
    num_layers: int
    experts: int = 0  # the routed experts' part of `mlp` (all layers, every expert)
    experts_per_token: int = 0  # of those, what one token uses (top_k of each layer's)

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
    def active(self) -> int:
        """Parameters one token's computation uses: all but the experts it was not routed to."""
        return self.total - self.experts + self.experts_per_token

    @property
    def per_layer(self) -> int:
        return (self.attention + self.mlp + self.layer_norms) // max(self.num_layers, 1)


def count_parameters(config: ModelConfig) -> ParamCounts:
    record = architecture(config.architecture)
    parts = {"attention": 0, "mlp": 0, "norms": 0, "experts": 0}
    # NOTE: a layer's tensors depend on the layer only through whether its MLP is a Mixture of
    # Experts: count each kind once (a 128-expert layer lists ~400 tensors).
    kinds: dict[bool, dict[str, int]] = {}
    for layer in range(config.num_layers):
        moe = config.is_moe_layer(layer)
        if moe not in kinds:
            kind = dict.fromkeys(parts, 0)
            for name, shape in record.layer_tensors(config, layer).items():
                n = math.prod(shape)
                part = {"self_attn": "attention", "mlp": "mlp"}.get(name.split(".")[0], "norms")
                kind[part] += n
                kind["experts"] += n if is_expert_tensor(name) else 0
            kinds[moe] = kind
        for part, n in kinds[moe].items():
            parts[part] += n
    moe = config.moe
    per_token = parts["experts"] * moe.top_k // moe.num_experts if moe else 0
    embedding = config.vocab_size * config.hidden_size
    return ParamCounts(
        embedding=embedding,
        attention=parts["attention"],
        mlp=parts["mlp"],
        layer_norms=parts["norms"],
        final_norm=config.hidden_size,
        lm_head=0 if config.tie_word_embeddings else embedding,
        num_layers=config.num_layers,
        experts=parts["experts"],
        experts_per_token=per_token,
    )


def experts_read_fraction(config: ModelConfig, batch: int) -> float:
    """The share of a Mixture of Experts' experts a decode step of `batch` sequences runs, if
    the router spread tokens evenly: 1 - (1 - k/E)^batch (k/E for one sequence). Computed on
    the whole model's config: a tensor-parallel rank's experts are hit at the same rate."""
    moe = config.moe
    if moe is None:
        return 0.0
    return 1 - (1 - moe.top_k / moe.num_experts) ** batch


def decode_read_params(config: ModelConfig, counts: ParamCounts, batch: int,
                       expert_fraction: float) -> int:  # fmt: skip
    """Parameters a decode step of `batch` sequences reads (`config`, `counts`: the whole model
    or one rank's slice): every layer weight but the experts no sequence was routed to
    (`expert_fraction` of them are read), the LM head's whole matrix (tied or not), and only
    the `batch` embedding rows it looks up."""
    head = config.vocab_size * config.hidden_size
    experts = round(counts.experts * expert_fraction)
    rest = counts.attention + counts.mlp - counts.experts + counts.layer_norms + counts.final_norm
    return rest + experts + head + min(batch, config.vocab_size) * config.hidden_size


def tp_shard(config: ModelConfig, tp: int) -> ModelConfig:
    """The slice of the model one of `tp` tensor-parallel ranks holds, as a config.

    Query heads, the MLP's intermediate size and the vocabulary (embedding and LM head) are split
    across ranks; norms are replicated. A Mixture of Experts is split by expert (expert
    parallelism, layers/moe.py): each rank holds E / tp whole experts, and of a token's top_k at
    most that many; its router (experts x hidden per layer, replicated) is counted at the
    rank's share. KV heads are split when there are at least `tp` of them,
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
    if not architecture(config.architecture).tensor_parallel:
        raise ValueError(f"the {config.architecture} architecture cannot be split over "
                         f"tensor_parallel_size {tp}")  # fmt: skip
    moe = config.moe
    if moe is not None:
        if moe.num_experts % tp:
            raise ValueError(
                f"tensor_parallel_size {tp} must divide the model's {moe.num_experts} experts "
                "(each rank holds whole experts)"
            )
        local = moe.num_experts // tp
        shared = math.ceil(moe.shared_intermediate_size / tp)
        moe = replace(moe, num_experts=local, top_k=min(moe.top_k, local),
                      shared_intermediate_size=shared)  # fmt: skip
    return config.with_overrides(
        num_heads=heads // tp,
        num_kv_heads=max(kv // tp, 1),
        # Uneven splits are padded up, so the largest rank is the one that must fit.
        intermediate_size=math.ceil(config.intermediate_size / tp),
        vocab_size=math.ceil(config.vocab_size / tp),
        moe=moe,
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
    # A pre-quantised HF checkpoint (inferd/loader/hf_quant_config.py): its QuantFormat, and
    # the bytes its weights take once repacked for the C kernels (the rest in float32)
    quant: object | None = None
    quant_held: int = 0

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
    for _name, (shape, dtype) in shapes.items():
        n = math.prod(shape)
        nbytes = n * _SAFETENSORS_BYTES.get(dtype.upper(), 4)
        stored, data = stored + n, data + nbytes
        p, b = by_type.get(dtype, (0, 0))
        by_type[dtype] = (p + n, b + nbytes)
    quant, held = checkpoint.quant, 0
    if quant is not None:  # parameters are the logical weights, not the packed words
        from inferd.loader.hf_quantized import logical_shapes, stored_weight_bytes

        held = stored_weight_bytes(shapes, quant, 4)
        shapes = {n: (s, "") for n, s in logical_shapes(
            {n: s for n, (s, _) in shapes.items()}, quant).items()}  # fmt: skip
        stored = sum(math.prod(s) for s, _ in shapes.values())
    for name, (shape, _) in shapes.items():
        n = math.prod(shape)
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
        quant=quant,
        quant_held=held,
        by_type=by_type,
    )

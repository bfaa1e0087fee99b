"""What one engine step reads and computes, from the loaded model and the step's rows: the
accounting behind MBU and MFU (inferd/step_efficiency.py).

    traffic = ModelTraffic.of_model(model, model_config, kv_token_bytes, "float32")
    work = traffic.work(rows)     # rows: (first position, tokens computed, logits rows) each

Weights are counted in the format the model holds them (a GGUF file's blocks, per row range:
Gemma's fused q/k/v mixes Q5_0 and Q8_0; int8; bfloat16 ...), each read once per step:

* every decoder layer's matrices: read once, 2 FLOPs per weight per token;
* the LM head: read when some row needs logits, 2 FLOPs per weight per logits row;
* the embedding: only the rows of the step's tokens (no FLOPs);
* a Mixture of Experts' experts: at most min(experts held, tokens × top_k) of them are read per
  layer, the exact count for one token, an upper bound for more (which experts the router picks
  is not looked at: that would cost a device sync); FLOPs are exact (each token runs top_k).

The KV cache: per layer, each row reads its attended context once (min(context, window)
tokens; keys and values, in the cache's own bytes per token); attention costs 4 FLOPs per
query head, head dimension and attended key (q·k and the weighted sum of v), counted under
the compute dtype. Norms, biases, the MoE router and LoRA adapters are left out (well under
1% of a step's bytes on the models here), and so is a vision tower (plain torch layers without
a weight method: it runs only for a request's images, not every step). Under tensor
parallelism the rank holds 1/N of the weights and KV: the counts are of the whole model (rank
0's times N).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import repeat

import torch
from torch import nn

from inferd.layers.embedding import LMHead, VocabEmbedding
from inferd.layers.gguf_blocks import BlockPart, BlockWeight
from inferd.layers.moe import ExpertLinear
from inferd.layers.quant import Fp8Method, Int4Method, Int8Method
from inferd.step_efficiency import StepWork

_QUANTIZED = {Int8Method: "int8", Fp8Method: "fp8"}


def part_format(part: BlockPart) -> str:
    """A block part as GGUF names its type: q{bits}_0 (a scale per block), q{bits}_1 (and an
    offset), q{bits}_k (K-quants: scales of scales), iq4_nl (a 4-bit codebook). It names how the
    kernel reads the part (inferd repacks Q2_K/Q3_K as 4-bit), which is what its speed follows."""
    if part.codebook is not None:
        return "iq4_nl"
    if part.scale_super is not None or part.offset_super is not None:
        return f"q{part.bits}_k"
    return f"q{part.bits}_{0 if part.offset is None else 1}"


def dtype_format(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Matrix:
    """One weight matrix (or a block part of it) as a kernel reads it."""

    fmt: str
    bytes: int
    macs: int  # multiply-adds per input row: out × in


def _nbytes(tensors: Iterable[torch.Tensor]) -> int:
    seen, total = set(), 0
    for t in tensors:
        key = (t.data_ptr(), t.numel())
        if t.numel() and key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def _block_matrices(blocks: BlockWeight) -> list[Matrix]:
    return [Matrix(part_format(p), p.nbytes, p.shape[0] * p.shape[1]) for p in blocks.parts]


def matrices(layer: nn.Module, out_features: int, in_features: int) -> list[Matrix]:
    """The matrices a step multiplies by when it runs `layer` (its method's own format)."""
    method = layer.quant_method
    blocks = getattr(method, "blocks", None)
    if isinstance(blocks, BlockWeight):
        return _block_matrices(blocks)
    macs = out_features * in_features
    fp8 = getattr(method, "fp8", None)  # an fp8 checkpoint's weights (Fp8CheckpointMethod)
    if fp8 is not None:
        return [Matrix("fp8", _nbytes(fp8.buffers()), macs)]
    if isinstance(method, Int4Method):  # NOTE: the int4 kernel's; large steps read bf16
        return [Matrix("int4", _nbytes(method.kernel.buffers()), macs)]
    for kind, fmt in _QUANTIZED.items():
        if isinstance(method, kind):
            return [Matrix(fmt, _nbytes(method.kernel.buffers()), macs)]
    weight = layer.weight
    return [Matrix(dtype_format(weight.dtype), _nbytes([weight]), macs)]


@dataclass(frozen=True)
class KVGroup:
    window: int | None  # tokens a query attends (itself included); None: all before it
    layers: int
    token_bytes: float  # one token's keys and values in all the group's layers


def _add(into: dict[str, float], fmt: str, value: float) -> None:
    into[fmt] = into.get(fmt, 0.0) + value


@dataclass(frozen=True)
class ModelTraffic:
    layer_bytes: float  # decoder layers' matrices (experts excluded), whole model
    layer_macs: dict[str, float]  # per token, by format
    head_bytes: float
    head_macs: dict[str, float]  # per logits row, by format
    embedding_row_bytes: float
    kv_groups: tuple[KVGroup, ...]
    num_heads: int
    head_dim: int
    attention_format: str
    # Mixture of Experts, summed over its layers: one expert's bytes and multiply-adds (per
    # token) in every MoE layer together, how many experts each layer holds, tokens' choices.
    expert_bytes: float = 0.0
    expert_macs: dict[str, float] | None = None
    experts_held: int = 0
    top_k: int = 0

    @classmethod
    def of_model(cls, model: nn.Module, config, kv_token_bytes: list[float],
                 compute_dtype: torch.dtype, ranks: int = 1) -> ModelTraffic:  # fmt: skip
        """`config`: the whole model's ModelConfig; `kv_token_bytes`: per KV group (in
        `config.kv_groups()` order), one token's bytes in all its layers on this rank."""
        layer_macs: dict[str, float] = {}
        head_macs: dict[str, float] = {}
        expert_macs: dict[str, float] = {}
        layer_bytes = head_bytes = embedding_row_bytes = expert_bytes = 0.0
        held = 0
        for module in model.modules():
            if getattr(module, "quant_method", None) is None:
                continue
            if isinstance(module, VocabEmbedding):
                (m,) = _merge(matrices(module, module.rows, config.hidden_size))
                embedding_row_bytes = m.bytes / module.rows
            elif isinstance(module, LMHead):
                for m in matrices(module, module.shard_sizes[0], config.hidden_size):
                    head_bytes += m.bytes
                    _add(head_macs, m.fmt, m.macs)
            elif isinstance(module, ExpertLinear):
                count, per_expert = _experts(module)
                held = count
                for m in per_expert:
                    expert_bytes += m.bytes / count
                    _add(expert_macs, m.fmt, m.macs / count)
            elif hasattr(module, "in_features") and hasattr(module, "out_features"):
                for m in matrices(module, module.out_features, module.in_features):
                    layer_bytes += m.bytes
                    _add(layer_macs, m.fmt, m.macs)
        windows = [window for window, _ in config.kv_groups()]
        sizes = [len(layers) for _, layers in config.kv_groups()]
        groups = tuple(KVGroup(w, n, ranks * b)
                       for w, n, b in zip(windows, sizes, kv_token_bytes, strict=True))  # fmt: skip
        moe = config.moe
        return cls(
            layer_bytes=ranks * layer_bytes,
            layer_macs={f: ranks * v for f, v in layer_macs.items()},
            head_bytes=ranks * head_bytes,
            head_macs={f: ranks * v for f, v in head_macs.items()},
            embedding_row_bytes=embedding_row_bytes,
            kv_groups=groups,
            num_heads=config.num_heads,
            head_dim=config.head_dim,
            attention_format=dtype_format(compute_dtype),
            expert_bytes=expert_bytes,
            expert_macs=expert_macs or None,
            experts_held=held * ranks if moe is not None else 0,
            top_k=moe.top_k if moe is not None else 0,
        )

    def work(self, rows: Iterable[tuple[int, int, int]]) -> StepWork:
        """`rows`: per sequence of the step, (tokens already in its KV cache, tokens computed
        now, logits rows it needs)."""
        tokens = logits = 0
        attended = [0] * len(self.kv_groups)  # keys the step's queries attend, per group
        kv_tokens = [0] * len(self.kv_groups)  # KV tokens read, per group
        decode_ends = []  # one-token rows: their query attends what they read (the common case)
        for start, n, need in rows:
            tokens += n
            logits += need
            if n == 1:
                decode_ends.append(start + 1)
                continue
            for g, group in enumerate(self.kv_groups):
                attended[g] += keys_attended(start, n, group.window)
                end = start + n
                kv_tokens[g] += end if group.window is None else min(end, group.window)
        if decode_ends:  # NOTE: summed per group in C (map/sum): a 256-row step stays cheap
            for g, group in enumerate(self.kv_groups):
                w = group.window
                read = sum(decode_ends) if w is None else sum(map(min, decode_ends, repeat(w)))
                attended[g] += read
                kv_tokens[g] += read
        flops: dict[str, float] = {}
        for fmt, macs in self.layer_macs.items():
            _add(flops, fmt, 2.0 * tokens * macs)
        weight_bytes = self.layer_bytes + tokens * self.embedding_row_bytes
        if logits:
            weight_bytes += self.head_bytes
            for fmt, macs in self.head_macs.items():
                _add(flops, fmt, 2.0 * logits * macs)
        if self.expert_macs and tokens:
            weight_bytes += min(self.experts_held, tokens * self.top_k) * self.expert_bytes
            for fmt, macs in self.expert_macs.items():
                _add(flops, fmt, 2.0 * tokens * self.top_k * macs)
        per_key = 4.0 * self.num_heads * self.head_dim
        attention = sum(per_key * g.layers * a for g, a in zip(self.kv_groups, attended))
        if attention:
            _add(flops, self.attention_format, attention)
        kv_bytes = sum(g.token_bytes * n for g, n in zip(self.kv_groups, kv_tokens))
        return StepWork(weight_bytes, kv_bytes, flops)


def keys_attended(start: int, n: int, window: int | None) -> int:
    """Σ over the queries at positions start .. start+n-1 of the keys each attends: min(p + 1,
    window), in closed form (a prefill chunk of thousands of tokens costs no loop)."""
    if n <= 0:
        return 0
    lo, hi = start + 1, start + n  # keys seen by the first and the last query, before the window
    if window is None or hi <= window:
        return (lo + hi) * n // 2
    if lo >= window:
        return n * window
    return (lo + window) * (window - lo + 1) // 2 + (hi - window) * window


def _merge(ms: list[Matrix]) -> list[Matrix]:
    """Parts of one matrix as one (the embedding: only its bytes per row matter)."""
    return [Matrix(ms[0].fmt, sum(m.bytes for m in ms), sum(m.macs for m in ms))]


def _experts(layer: ExpertLinear) -> tuple[int, list[Matrix]]:
    """(experts held, the matrices of all of them) of one kind of expert matrix."""
    blocks = getattr(layer.quant_method, "blocks", None)
    if blocks is not None:
        return len(blocks), [m for b in blocks for m in _block_matrices(b)]
    count = layer.weight.shape[0]
    macs = count * layer.out_features * layer.in_features
    return count, [Matrix(dtype_format(layer.weight.dtype), _nbytes([layer.weight]), macs)]

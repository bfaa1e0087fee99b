"""The roofline of one model step on one device: the bytes it must move and the arithmetic it
must do, and which of the two takes longer.

    time = max(bytes / bandwidth, FLOPs / matrix throughput) + overhead (+ all-reduces)

A decode step of B sequences reads every weight once (whatever B: the rows share each weight
read), each sequence's KV cache, and writes B rows of logits; it multiplies B rows by every
matrix (2 FLOPs a weight a row) and attends over each sequence's context. Few rows and many
bytes: bound by memory until B reaches the device's balance point (its FLOP/s over its bytes/s
divided by 2 FLOPs a weight, times the bytes a weight takes). A prefill chunk of T tokens reads
the weights once too but multiplies T rows: bound by compute for all but tiny chunks. The LM head
runs on the last position of each sequence only (the others' logits are never sampled).

`StepWork` is what a step asks for, `StepTime` what it costs on given limits and why; the
limits (bandwidth, throughput by format and rows, overheads) come from machine_peaks.py (this
machine, measured) or hardware_profiles.py (published), through step_model.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferd.config import ModelConfig
from inferd.memory.kv import kv_bytes_for_context, kv_bytes_per_token
from inferd.memory.weights import count_parameters, decode_read_params, experts_read_fraction

LOGIT_BYTES = 4  # float32 logits: written by the head, read by the sampler


@dataclass(frozen=True)
class StepWork:
    """What one step asks of one device."""

    rows: int  # rows of the matrix products (tokens in the step)
    weight_bytes: float
    kv_bytes: float  # KV read (attention over the context) and written (the new tokens)
    other_bytes: float  # logits
    matrix_flops: dict[str, float] = field(default_factory=dict)  # by weight format
    head_rows: int = 0  # rows the LM head multiplies (sequences sampled this step)
    head_flops: float = 0.0
    head_format: str = ""
    attention_flops: float = 0.0
    attention_format: str = "float32"  # the activations' dtype: the rate attention runs at

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes + self.other_bytes

    @property
    def flops(self) -> float:
        return sum(self.matrix_flops.values()) + self.head_flops + self.attention_flops


@dataclass(frozen=True)
class StepTime:
    memory_s: float
    compute_s: float
    overhead_s: float = 0.0
    communication_s: float = 0.0  # tensor-parallel all-reduces, pipeline sends
    intensity: float = 0.0  # FLOPs per byte of the step
    balance: float = 0.0  # the device's FLOP/s over its bytes/s at this step's rows

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"

    @property
    def time_s(self) -> float:
        return max(self.memory_s, self.compute_s) + self.overhead_s + self.communication_s

    def why(self) -> str:
        """Which bound applies, and why, in a sentence."""
        if self.bound == "memory":
            return (f"memory-bound: {self.intensity:.1f} FLOP/byte is below the device's "
                    f"balance of {self.balance:.1f} FLOP/byte")  # fmt: skip
        return (f"compute-bound: {self.intensity:.1f} FLOP/byte is above the device's balance "
                f"of {self.balance:.1f} FLOP/byte")  # fmt: skip


def roofline_time(
    work: StepWork,
    bandwidth: float,
    flops_at,
    overhead_s: float = 0.0,
    communication_s: float = 0.0,
) -> StepTime:
    """`work` on a device reading `bandwidth` bytes/s and multiplying at `flops_at(format,
    rows)` FLOP/s (each format's matrices at its own rate)."""
    compute = sum(f / flops_at(fmt, work.rows) for fmt, f in work.matrix_flops.items() if f)
    if work.head_flops:
        compute += work.head_flops / flops_at(work.head_format, max(work.head_rows, 1))
    if work.attention_flops:
        compute += work.attention_flops / flops_at(work.attention_format, work.rows)
    memory = work.bytes / bandwidth
    intensity = work.flops / work.bytes if work.bytes else 0.0
    balance = (work.flops / compute) / bandwidth if compute else 0.0
    return StepTime(memory, compute, overhead_s, communication_s, intensity, balance)


def attention_flops(config: ModelConfig, new_tokens: int, context_before: int, tp: int) -> float:
    """QK^T and PV of `new_tokens` queries over `context_before` cached tokens and, causally,
    each other (2 products x 2 FLOPs x query width x keys); sliding layers see their window."""
    width = config.num_heads * config.head_dim / tp
    total = 0.0
    for layer in range(config.num_layers):
        window = config.layer_window(layer)
        # keys seen by the average query of the chunk
        keys = context_before + (new_tokens + 1) / 2
        if window is not None:
            keys = min(keys, window)
        total += 4 * width * keys * new_tokens
    return total


@dataclass(frozen=True)
class ModelSlice:
    """One device's share of a model (one tensor-parallel rank of one pipeline stage), in the
    terms a step's work is counted in."""

    config: ModelConfig  # the whole model's (attention widths are divided by tp here)
    shard: ModelConfig  # one tensor-parallel rank's slice (inferd.memory.tp_shard)
    layer_params: dict[str, float]  # matrix params of the decoder layers by format, this device
    head_params: float  # LM head params on this device (the last stage's)
    head_format: str
    bytes_per_param: float  # the weights as held, per parameter (a GGUF file's blocks: ~0.6)
    kv_element: object  # the KV dtype's element (inferd.memory.kv)
    attention_format: str
    tp: int = 1
    pp: int = 1

    def decode_read_params(self, batch: int) -> float:
        """Parameters a step of `batch` rows reads here (inferd.memory's count: every layer
        weight but unrouted experts, the whole head, the looked-up embedding rows)."""
        counts = count_parameters(self.shard)
        fraction = experts_read_fraction(self.config, batch)
        total = decode_read_params(self.shard, counts, batch, fraction)
        head = self.shard.vocab_size * self.shard.hidden_size
        return (total - head) / self.pp + head


def decode_work(m: ModelSlice, batch: int, context: int) -> StepWork:
    """A decode step of `batch` sequences, each at `context` tokens, on one device."""
    kv = batch * (kv_bytes_for_context(m.shard, context, m.kv_element) +
                  kv_bytes_per_token(m.shard, m.kv_element)) / m.pp  # fmt: skip
    return StepWork(
        rows=batch,
        weight_bytes=m.decode_read_params(batch) * m.bytes_per_param,
        kv_bytes=kv,
        other_bytes=2 * batch * m.shard.vocab_size * LOGIT_BYTES,  # the last stage
        matrix_flops={f: 2 * p * batch for f, p in m.layer_params.items()},
        head_rows=batch,
        head_flops=2 * m.head_params * batch,
        head_format=m.head_format,
        attention_flops=attention_flops(m.config, 1, context, m.tp) * batch / m.pp,
        attention_format=m.attention_format,
    )


def prefill_work(m: ModelSlice, tokens: int, sequences: int = 1, context_before: int = 0,
                 decodes: int = 0, decode_context: int = 0) -> StepWork:  # fmt: skip
    """A step prefilling `tokens` prompt tokens of `sequences` sequences (a chunk each, after
    `context_before` cached tokens), beside `decodes` decoding sequences at `decode_context`."""
    per_seq = max(tokens // max(sequences, 1), 1)
    rows = tokens + decodes
    sampled = sequences + decodes
    kv_written = rows * kv_bytes_per_token(m.shard, m.kv_element)
    kv_read = decodes * kv_bytes_for_context(m.shard, decode_context, m.kv_element)
    weights = m.decode_read_params(max(rows, 1)) * m.bytes_per_param
    attention = (attention_flops(m.config, per_seq, context_before, m.tp) * sequences
                 + attention_flops(m.config, 1, decode_context, m.tp) * decodes)  # fmt: skip
    return StepWork(
        rows=rows,
        weight_bytes=weights,
        kv_bytes=(kv_written + kv_read) / m.pp,
        other_bytes=2 * sampled * m.shard.vocab_size * LOGIT_BYTES,
        matrix_flops={f: 2 * p * rows for f, p in m.layer_params.items()},
        head_rows=sampled,
        head_flops=2 * m.head_params * sampled,
        head_format=m.head_format,
        attention_flops=attention / m.pp,
        attention_format=m.attention_format,
    )

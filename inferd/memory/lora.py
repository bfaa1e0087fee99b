"""Memory of LoRA adapter slots (`--enable-lora --max-loras N --max-lora-rank R`): what
inferd/layers/lora.py allocates, float32, for every decoder layer's four projections:

    per projection  A [in, parts * R] + B [parts * R, out]     (parts: q/k/v 3, gate/up 2, else 1)
    one slot        4 bytes * R * layers * sum over projections of parts * (in + out)
    all slots       N * one slot

B of a fused projection is block-diagonal but held dense (the PyTorch path multiplies it whole;
the C layer skips its zero blocks), so a slot is the same size whatever ranks and targets the
adapters that fill it have. The parsed adapters kept in memory (--max-cpu-loras) are extra and
as small as the adapters are.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferd.config import ModelConfig

FLOAT32 = 4


@dataclass(frozen=True)
class AdapterSlotMemory:
    max_loras: int
    max_rank: int
    slot_bytes: int  # one slot

    @property
    def total_bytes(self) -> int:
        return self.max_loras * self.slot_bytes


def projection_widths(config: ModelConfig) -> list[tuple[int, int, int]]:
    """(parts, in, out) of each adapted projection of one decoder layer."""
    h, q, kv = config.hidden_size, config.num_heads * config.head_dim, config.num_kv_heads
    inter = config.intermediate_size
    return [(3, h, q + 2 * kv * config.head_dim), (1, q, h), (2, h, 2 * inter), (1, inter, h)]


def adapter_slot_memory(config: ModelConfig, max_loras: int, max_rank: int) -> AdapterSlotMemory:
    per_layer = sum(parts * (i + o) for parts, i, o in projection_widths(config))
    slot = FLOAT32 * max_rank * config.num_layers * per_layer
    return AdapterSlotMemory(max_loras, max_rank, slot)

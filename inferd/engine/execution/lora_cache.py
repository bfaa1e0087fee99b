"""Parsed LoRA adapters kept in memory (vLLM's --max-cpu-loras), so that an adapter evicted from
its slot and asked for again is copied back from here rather than read from disk again.

    AdapterCache.get(request, slots) → LoRAAdapter (read and checked on first use, LRU)
"""

from __future__ import annotations

from collections import OrderedDict

from inferd.layers.lora import LoRASlots
from inferd.loader.lora_adapter import LoRAAdapter, load_adapter
from inferd.lora_request import LoRARequest


class AdapterCache:
    def __init__(self, capacity: int):
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"max_cpu_loras must be a positive integer, got {capacity!r}")
        self.capacity = capacity
        self.adapters: OrderedDict[str, LoRAAdapter] = OrderedDict()

    def get(self, request: LoRARequest, slots: LoRASlots) -> LoRAAdapter:
        """The adapter of `request`, checked against the model `slots` belong to."""
        key = request.identity
        adapter = self.adapters.get(key)
        if adapter is None:
            num_layers = 1 + max(layer for layer, _ in slots.weights)
            adapter = load_adapter(request.lora_path, num_layers, slots.shapes(),
                                   slots.max_rank)  # fmt: skip
            self.adapters[key] = adapter
            while len(self.adapters) > self.capacity:
                self.adapters.popitem(last=False)
        self.adapters.move_to_end(key)
        return adapter

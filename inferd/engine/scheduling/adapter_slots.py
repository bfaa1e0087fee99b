"""Which LoRA adapter each of the engine's `max_loras` slots holds, as the scheduler sees it:
slots 1..max_loras (0 is the base model), each used by the unfinished requests that run under its
adapter, and evicted least recently used once no request uses it.

    acquire(lora) → slot, or None: every slot is in use (the request waits; others go on)
    release(slot)  when a request that acquired it finishes
    take_loads()   the (slot, adapter) loads the device side must do before the next step

The slot a request holds does not change while it is unfinished (preemption included), so its
rows always name the adapter it started with.
"""

from __future__ import annotations

from collections import OrderedDict

from inferd.lora_request import LoRARequest


class AdapterSlots:
    def __init__(self, max_loras: int):
        self.max_loras = max_loras
        # slot → [adapter, requests using it], in least-recently-used order
        self.slots: OrderedDict[int, list] = OrderedDict()
        self._loads: list[tuple[int, LoRARequest]] = []
        self.requests_served: dict[str, int] = {}  # lora_name → requests that ran under it

    def acquire(self, lora: LoRARequest) -> int | None:
        for slot, entry in self.slots.items():
            if entry[0].identity == lora.identity:
                entry[1] += 1
                self.slots.move_to_end(slot)
                self._served(lora)
                return slot
        free = next((s for s in range(1, self.max_loras + 1) if s not in self.slots), None)
        if free is None:  # evict the least recently used adapter no request uses
            free = next((s for s, (_, users) in self.slots.items() if users == 0), None)
            if free is None:
                return None
            del self.slots[free]
        self.slots[free] = [lora, 1]
        self._loads.append((free, lora))
        self._served(lora)
        return free

    def _served(self, lora: LoRARequest) -> None:
        self.requests_served[lora.lora_name] = self.requests_served.get(lora.lora_name, 0) + 1

    def release(self, slot: int) -> None:
        self.slots[slot][1] -= 1

    def take_loads(self) -> list[tuple[int, LoRARequest]]:
        loads, self._loads = self._loads, []
        return loads

    def clear(self) -> None:
        """The device side's slots were emptied (its model was rebuilt after a sleep of level 2:
        engine/core/sleep_mode.py): the next request under an adapter loads it again. Only
        while no request holds a slot."""
        self.slots.clear()
        self._loads = []

    def resident(self) -> list[str]:
        """The names of the adapters in slots now."""
        return [entry[0].lora_name for entry in self.slots.values()]

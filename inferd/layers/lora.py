"""LoRA adapters resident in slots, applied per row beside the base projections.

    y = base(x);  for each adapter slot s with rows R_s in the step:
        y[R_s] += (x[R_s] A_s) B_s       (shrink to the rank, then expand; scale folded into B)

The base weights are never touched (dense or GGUF blocks alike): every adapted projection gets
a `LoRASlotWeights` with the A and B of every slot, and the step's rows are grouped by slot
once per step (`LoRASlots.prepare`), so a projection does one shrink and one expand product per
adapter present, none for the base model's rows (slot 0).

A fused projection (q/k/v, gate/up) has one A per logical part, side by side along the rank
axis ([in, parts * max_rank]), and a block-diagonal B: part j's rank columns feed only part j's
output columns. NOTE: the zeros (off the blocks, past an adapter's rank, a part the adapter does
not target) add exact zeros, so a smaller or partial adapter computes exactly its own sum.
The C decoder layer (cpu_kernels/decode_layer.c) reads these same tensors (`LoRASlotWeights.a`,
`.b`, `.part_cols`), skipping the off-block zeros, row by row: each row's result is independent
of which other adapters share its step.
"""

from __future__ import annotations

import torch

from inferd.layers.linear import Linear

# Our fused projections and PEFT's module names of their parts, in output order.
FUSED_PARTS = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "o_proj": ("o_proj",),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "down_proj": ("down_proj",),
}


class LoRASlotWeights:
    """The slots' A and B of one projection. Plain tensors, not parameters: they are no part of
    the checkpoint, and the loader's bookkeeping never sees them."""

    def __init__(self, linear: Linear, parts: tuple[str, ...], max_loras: int, max_rank: int,
                 device: torch.device):  # fmt: skip
        self.parts, self.rank = parts, max_rank
        self.in_features, self.out_features = linear.in_features, linear.out_features
        width = len(parts) * max_rank
        self.a = torch.zeros(max_loras, self.in_features, width, device=device)
        self.b = torch.zeros(max_loras, width, self.out_features, device=device)
        edges = [0]
        for n in linear.shard_sizes:
            edges.append(edges[-1] + n)
        self.part_cols = edges  # part j's output columns: edges[j] .. edges[j + 1]

    def fill(self, index: int, pairs: dict[str, tuple[torch.Tensor, torch.Tensor]],
             scale: float) -> None:  # fmt: skip
        """Slot `index` (0-based) := the adapter's (A [r, in], B [out, r]) per part name."""
        self.a[index].zero_()
        self.b[index].zero_()
        for j, name in enumerate(self.parts):
            if name not in pairs:
                continue
            a, b = pairs[name]
            r, c0, c1 = a.shape[0], self.part_cols[j], self.part_cols[j + 1]
            k0 = j * self.rank
            self.a[index, :, k0 : k0 + r] = a.t()
            self.b[index, k0 : k0 + r, c0:c1] = (b * scale).t()

    def add_to(self, x: torch.Tensor, y: torch.Tensor,
               groups: list[tuple[int, torch.Tensor]]) -> None:  # fmt: skip
        """y[rows] += (x[rows] A_s) B_s for every (slot, rows) group, in float32."""
        for slot, rows in groups:
            xs = x.index_select(0, rows).float()
            delta = (xs @ self.a[slot - 1]) @ self.b[slot - 1]
            y.index_add_(0, rows, delta.to(y.dtype))


class LoRASlots:
    """A model's adapter slots (1..max_loras; 0 is the base model) and the step's row groups.
    The runner calls `prepare` with every token's slot before each forward; the adapted
    projections read the groups from here (one object per model: two engines never share)."""

    def __init__(self, max_loras: int, max_rank: int, device: torch.device):
        self.max_loras, self.max_rank, self.device = max_loras, max_rank, device
        # (layer index, projection) → its slot weights
        self.weights: dict[tuple[int, str], LoRASlotWeights] = {}
        self.groups: list[tuple[int, torch.Tensor]] = []
        self.token_slots = torch.zeros(0, dtype=torch.int64)  # CPU: what the C layer reads
        self.resident: dict[int, int] = {}  # slot → lora_int_id loaded there

    def attach(self, layer_index: int, name: str, linear: Linear) -> None:
        w = LoRASlotWeights(linear, FUSED_PARTS[name], self.max_loras, self.max_rank, self.device)
        self.weights[(layer_index, name)] = w

        def hook(module, args, output, key=(layer_index, name)):
            if self.groups:
                self.weights[key].add_to(args[0], output, self.groups)
            return output

        linear.register_forward_hook(hook)

    def shapes(self) -> dict[str, tuple[int, int]]:
        """PEFT module name → (out, in) features, as an adapter's tensors must be."""
        out = {}
        for w in self.weights.values():
            for j, part in enumerate(w.parts):
                out[part] = (w.part_cols[j + 1] - w.part_cols[j], w.in_features)
        return out

    def load(self, slot: int, lora_int_id: int, weights: dict, scale: float) -> None:
        """Put an adapter (loader/lora_adapter.py `LoRAAdapter.weights`) into `slot`."""
        if not 1 <= slot <= self.max_loras:
            raise ValueError(f"adapter slot {slot} is outside 1..{self.max_loras}")
        per_layer: dict[int, dict[str, tuple]] = {}
        for (layer, module), pair in weights.items():
            per_layer.setdefault(layer, {})[module] = pair
        for (layer, _), w in self.weights.items():
            w.fill(slot - 1, per_layer.get(layer, {}), scale)
        self.resident[slot] = lora_int_id

    def prepare(self, token_slots: list[int]) -> None:
        """The step's tokens' slots (0: base model); groups the rows by adapter."""
        bad = next((s for s in token_slots if s and s not in self.resident), None)
        if bad is not None:
            raise ValueError(f"a row asks for adapter slot {bad}, which holds no adapter")
        self.token_slots = torch.tensor(token_slots, dtype=torch.int64)
        present = sorted({s for s in token_slots if s})
        self.groups = [
            (
                s,
                torch.tensor(
                    [i for i, t in enumerate(token_slots) if t == s],
                    dtype=torch.int64,
                    device=self.device,
                ),
            )  # fmt: skip
            for s in present
        ]

    def slot_bytes(self) -> int:
        """Memory one slot takes (every adapted projection's A and B, float32)."""
        return sum((w.a[0].numel() + w.b[0].numel()) * 4 for w in self.weights.values())


def attach_lora(model: torch.nn.Module, max_loras: int, max_rank: int) -> LoRASlots:
    """Give every decoder layer's four projections adapter slots; returns the model's slots
    (also `model.lora`). Raises ValueError for a model whose layers do not spell out dense
    projections (a Mixture of Experts) or that is split across ranks."""
    if model.tp.enabled:
        raise ValueError("enable_lora: LoRA adapters with tensor parallelism are not supported")
    device = model.model.embed_tokens.weight.device
    slots = LoRASlots(max_loras, max_rank, device)
    for i, layer in enumerate(model.model.layers):
        parts = layer.parts()
        linears = {"qkv_proj": parts.attention.qkv_proj, "o_proj": parts.attention.o_proj,
                   "gate_up_proj": getattr(parts.mlp, "gate_up_proj", None),
                   "down_proj": getattr(parts.mlp, "down_proj", None)}  # fmt: skip
        for name, linear in linears.items():
            if not isinstance(linear, Linear):
                raise ValueError("enable_lora: LoRA adapters need dense MLPs; this model's "
                                 f"layer {i} has a Mixture of Experts")  # fmt: skip
            slots.attach(i, name, linear)
    model.lora = slots
    if getattr(model, "cpu_decoder", None) is not None:
        model.cpu_decoder.attach_lora(slots)
    return slots

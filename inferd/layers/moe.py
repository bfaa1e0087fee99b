"""Mixture of Experts: a router scores every expert for each token, the `top_k` best experts'
gated MLPs run on it, and their outputs are summed weighted by the router's scores (Qwen3-MoE,
OLMoE, Mixtral; Qwen2-MoE adds a shared expert every token uses, behind a sigmoid gate).

A step's (token, choice) pairs are sorted by expert, so each expert with work multiplies its
whole group of rows in one GEMM (`LinearMethod.apply_grouped`), and the products are added back
into their tokens' rows weighted by the router. The Python loop runs over experts, never over
tokens: a decode step of one sequence touches `top_k` experts, a prefill most of them.

Weights: dense experts are one [experts, out, in] matrix per kind (the fused [gate; up], and
down) multiplied by PyTorch's GEMM; a GGUF file's quantised experts (`ffn_*_exps`) keep their
blocks, one block matrix per expert, multiplied by the C block kernel at every group size, the
same arithmetic whatever else shares the step (`ExpertBlocks`, as `BlockMethod`). The
re-quantising modes (int8, int4, fp8) do not cover experts: they are refused at load.

The router (moe_router.py) is held in float32 whatever the scheme. gpt-oss adds biases to the
router and to every expert, and its own activation (the clamped SwiGLU, activation.py).

A CUDA graph cannot capture the grouped path (its group sizes are read back to the host): under
capture every expert runs on every row instead (`Experts.every_expert`), the same sums read off
all the experts.

Expert parallelism: under a group of N ranks (the tensor-parallel group), rank r holds experts
[r E/N, (r+1) E/N) whole, while attention and a shared expert are split as usual. Every rank
routes every token (the hidden states are replicated), computes the pairs routed to its own
experts, and one all-reduce sums the ranks' partial outputs.
"""

from __future__ import annotations

import torch
from torch import nn

from inferd.config import ModelConfig
from inferd.distributed.state import SINGLE, TPGroup
from inferd.layers.activation import clamped_swiglu, gated
from inferd.layers.gguf_blocks import BlockWeight, packed, stack
from inferd.layers.linear_method import DenseMethod, LinearMethod, dropped
from inferd.layers.moe_router import Router, SharedGate
from inferd.layers.weight_scheme import WeightScheme, as_scheme

# checkpoint sub-name of one expert's matrix → (ExpertLinear, shard)
_EXPERT_MATRICES = {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
                    "down_proj": ("down_proj", 0)}  # fmt: skip


class ExpertBlocks(LinearMethod):
    """Experts that keep a GGUF file's blocks: one BlockWeight per expert ([gate; up] stacked),
    each group of rows multiplied by the C block kernel."""

    wants_blocks = True

    def __init__(self):
        super().__init__()
        self.blocks: nn.ModuleList | None = None  # None: the checkpoint had no blocks for them
        self._shards: dict[tuple[int, int], BlockWeight] = {}  # (expert, shard) → packed

    def take_blocks(self, layer: nn.Module, shard, blocks: BlockWeight) -> None:
        self._shards[shard] = blocks

    def finish(self, layer: nn.Module) -> None:
        """Blocks for every expert, or (some part came dense) every part dense."""
        shards, self._shards = self._shards, {}
        if not shards:
            return
        experts, sizes = layer.weight.shape[0], layer.shard_sizes
        if len(shards) == experts * len(sizes):
            per_expert = []
            for e in range(experts):
                parts = [shards[e, s] for s in range(len(sizes))]
                per_expert.append(parts[0] if len(parts) == 1 else stack(parts))
            self.blocks = nn.ModuleList(per_expert)
            layer.weight = dropped(layer.weight)
            return
        for (e, s), parts in shards.items():
            start = sum(sizes[:s])
            layer.weight.data[e, start : start + sizes[s]] = parts.dequantized()

    def kernel_for(self, rows: int) -> str:
        return "gemm" if self.blocks is None else "blocks"

    def apply_grouped(self, layer: nn.Module, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        if self.blocks is None:
            return super().apply_grouped(layer, x, counts)
        y = torch.empty(x.shape[0], self.blocks[0].shape[0], dtype=torch.float32)
        start = 0
        for expert, n in enumerate(counts):
            if n:
                y[start : start + n] = self.blocks[expert](x[start : start + n])
            start += n
        return y


def expert_method(scheme: WeightScheme) -> LinearMethod:
    if scheme.quantize is not None:
        raise ValueError(
            f"--quantization {scheme.quantize} does not cover Mixture-of-Experts experts; run "
            "this model without it (dense weights), or from a GGUF file (its own blocks)"
        )
    if scheme.blocks:
        return ExpertBlocks()
    return DenseMethod()


class ExpertLinear(nn.Module):
    """One matrix per expert this rank holds, [experts, out, in], of one kind: the fused
    [gate; up] (two shards) or down. Checkpoints give them one expert, one shard at a time."""

    def __init__(self, num_experts: int, in_features: int, shard_sizes: list[int],
                 scheme: WeightScheme, bias: bool = False):  # fmt: skip
        """`bias`: one per expert and output (gpt-oss), added to each group's product."""
        super().__init__()
        self.shard_sizes, self.in_features = shard_sizes, in_features
        self.out_features = sum(shard_sizes)
        shape = (num_experts, self.out_features, in_features)
        self.weight = nn.Parameter(torch.empty(shape, dtype=scheme.dtype), requires_grad=False)
        self.bias = None
        if bias:
            bias_shape = (num_experts, self.out_features)
            self.bias = nn.Parameter(torch.empty(bias_shape, dtype=scheme.dtype),
                                     requires_grad=False)  # fmt: skip
        self.quant_method = expert_method(scheme)
        self.loaded: set[tuple[int, int]] = set()  # (expert, shard) filled so far
        self.loaded_bias: set[tuple[int, int]] = set()

    def load_expert(self, expert: int, shard: int, weight) -> None:
        """Expert `expert`'s (this rank's numbering) part `shard` from a lazy weight."""
        expected = (self.shard_sizes[shard], self.in_features)
        if tuple(weight.shape) != expected:
            raise ValueError(f"shape {tuple(weight.shape)}, the model expects {expected}")
        blocks = None
        if getattr(weight, "input_order", None) is not None:
            raise ValueError("GPTQ act-order (desc_act) experts are not supported; use a "
                             "checkpoint quantised without desc_act")  # fmt: skip
        if self.quant_method.wants_blocks and hasattr(weight, "load_blocks"):
            rows = expected[0]
            blocks = packed(lambda first, n: weight.load_blocks((first, n)), rows, self.in_features)
        if blocks is not None:
            self.quant_method.take_blocks(self, (expert, shard), blocks)
        else:
            start = sum(self.shard_sizes[:shard])
            self.weight.data[expert, start : start + expected[0]] = weight.load(self.weight.dtype)
        self.loaded.add((expert, shard))

    def load_expert_bias(self, expert: int, shard: int, weight) -> None:
        if self.bias is None:
            raise ValueError("a bias for experts without one")
        if tuple(weight.shape) != (self.shard_sizes[shard],):
            raise ValueError(f"shape {tuple(weight.shape)}, the model expects "
                             f"({self.shard_sizes[shard]},)")  # fmt: skip
        start, dtype = sum(self.shard_sizes[:shard]), self.bias.dtype
        self.bias.data[expert, start : start + self.shard_sizes[shard]] = weight.load(dtype)
        self.loaded_bias.add((expert, shard))

    def finish_loading(self) -> None:
        self.quant_method.finish(self)

    def grouped(self, x: torch.Tensor, counts: list[int],
                experts: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """`experts`: each row's expert (on x's device), for the biases (NOTE: given, not
        made from `counts` here: a CUDA graph's capture may not copy from the host)."""
        y = self.quant_method.apply_grouped(self, x, counts)
        if self.bias is None:
            return y
        return y + self.bias.index_select(0, experts).to(y.dtype)

    def extra_repr(self) -> str:
        return f"experts={self.weight.shape[0]}, in={self.in_features}, out={self.shard_sizes}"


class Experts(nn.Module):
    """The routed experts this rank holds: experts [first, first + count) of the model's."""

    def __init__(self, config: ModelConfig, scheme: WeightScheme, first: int, count: int):
        super().__init__()
        moe, hidden = config.moe, config.hidden_size
        inter = moe.intermediate_size
        self.first, self.count, self.total = first, count, moe.num_experts
        self.gate_up_proj = ExpertLinear(count, hidden, [inter, inter], scheme, moe.biases)
        self.down_proj = ExpertLinear(count, inter, [hidden], scheme, moe.biases)
        self.act = gated(config.hidden_act) if moe.swiglu_limit is None else clamped_swiglu(
            moe.swiglu_alpha, moe.swiglu_limit)  # fmt: skip

    def load_checkpoint_tensor(self, rest: str, weight) -> None:
        """`rest` is the name under this module, `E.gate_proj.weight` (or `.bias`; E the
        model's expert number): experts other ranks hold are skipped unread."""
        parts = rest.split(".")
        if len(parts) != 3 or not parts[0].isdigit() or parts[1] not in _EXPERT_MATRICES \
                or parts[2] not in ("weight", "bias"):  # fmt: skip
            raise ValueError("it has no place in the model")
        expert = int(parts[0])
        if expert >= self.total:
            raise ValueError(f"the model has {self.total} experts")
        if self.first <= expert < self.first + self.count:
            kind, shard = _EXPERT_MATRICES[parts[1]]
            linear = getattr(self, kind)
            load = linear.load_expert if parts[2] == "weight" else linear.load_expert_bias
            load(expert - self.first, shard, weight)

    def missing_tensors(self) -> list[str]:
        """Names (under this module) of expert matrices of this rank not loaded."""
        out = []
        for kind, (linear, shard) in _EXPERT_MATRICES.items():
            module = getattr(self, linear)
            out += [f"{e + self.first}.{kind}.weight" for e in range(self.count)
                    if (e, shard) not in module.loaded]  # fmt: skip
            if module.bias is not None:
                out += [f"{e + self.first}.{kind}.bias" for e in range(self.count)
                        if (e, shard) not in module.loaded_bias]  # fmt: skip
        return out

    def forward(self, x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """Σ over each token's chosen experts held here of weight × expert(x): float32."""
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return self.every_expert(x, weights, chosen)
        tokens, k = chosen.shape
        slots = torch.arange(tokens * k, device=x.device)  # pair p = token p // k, choice p % k
        experts = chosen.reshape(-1)
        if self.count != self.total:  # expert parallel: only the pairs routed to our experts
            mine = (experts >= self.first) & (experts < self.first + self.count)
            slots, experts = slots[mine], experts[mine] - self.first
        order = torch.argsort(experts, stable=True)
        slots, experts = slots[order], experts[order]
        counts = torch.bincount(experts, minlength=self.count).tolist()
        rows = slots // k
        h = self.act(self.gate_up_proj.grouped(x.index_select(0, rows), counts, experts))
        y = self.down_proj.grouped(h, counts, experts).float() * weights.reshape(-1)[slots, None]
        # NOTE: index_add_ adds each token's experts in expert order, as HF's per-expert loop.
        return torch.zeros(tokens, x.shape[1], dtype=torch.float32, device=x.device).index_add_(
            0, rows, y
        )

    def every_expert(self, x: torch.Tensor, weights: torch.Tensor,
                     chosen: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """The same sum with static shapes and no host sync, for a CUDA graph's capture (the
        grouped path reads the group sizes back to the host): every expert runs on every row,
        scaled by the row's router weight for it, 0 where it was not chosen. It reads every
        expert each step; `--enforce-eager` keeps the grouped path on a GPU."""
        tokens = x.shape[0]
        share = torch.zeros(tokens, self.total, dtype=torch.float32, device=x.device)
        share = share.scatter_(1, chosen, weights.float())[:, self.first : self.first + self.count]
        counts = [tokens] * self.count
        each = torch.arange(self.count, device=x.device).repeat_interleave(tokens)
        h = self.act(self.gate_up_proj.grouped(x.repeat(self.count, 1), counts, each))
        y = self.down_proj.grouped(h, counts, each).float().view(self.count, tokens, -1)
        return (y * share.t().unsqueeze(-1)).sum(0)


class SparseMoE(nn.Module):
    """The MLP of a Mixture-of-Experts layer: `gate` (the router), `experts`, and optionally a
    `shared_expert` (a dense gated MLP every token uses) scaled by `shared_expert_gate`."""

    def __init__(self, config: ModelConfig, scheme: WeightScheme | torch.dtype,
                 tp: TPGroup = SINGLE, shared: nn.Module | None = None):  # fmt: skip
        super().__init__()
        scheme, moe = as_scheme(scheme), config.moe
        first, count = tp.split(moe.num_experts, "the number of experts")
        self.tp = tp
        self.gate = Router(config.hidden_size, moe.num_experts, moe.top_k, moe.normalize_top_k,
                           moe.biases, moe.softmax_after_top_k)  # fmt: skip
        self.experts = Experts(config, scheme, first, count)
        self.shared_expert = shared
        self.shared_expert_gate = SharedGate(config.hidden_size) if moe.shared_gate else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.gate(x)
        y = self.tp.all_reduce(self.experts(x, weights, chosen))
        if self.shared_expert is not None:
            shared = self.shared_expert(x).float()
            if self.shared_expert_gate is not None:
                shared = self.shared_expert_gate(x) * shared
            y = y + shared
        return y

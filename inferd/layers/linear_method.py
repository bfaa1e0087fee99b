"""How a linear layer (or embedding, or LM head) holds its weight and multiplies by it.

Every such layer owns a `LinearMethod`, given by the model's `WeightScheme` when the layer is
built (inferd/layers/weight_scheme.py; vLLM calls the same idea `quant_method`). The method
owns its weight format and, per step, picks the kernel for the step's shape:

    load   a checkpoint tensor arrives: the method may take it in its own format (a GGUF file's
           blocks); otherwise the layer copies it, dense, into `layer.weight`
    finish after loading: convert (quantise, stack blocks), drop what is no longer needed
    apply  x [rows, in] → [rows, out]; `kernel_for(rows)` names the kernel a step of that many
           rows uses
    apply_grouped
           one matrix per group ([groups, out, in]: a Mixture of Experts' experts), x's rows
           sorted by group, `counts[g]` rows each: one product per group with rows

The dense matrix, when a method keeps one, stays the layer's `weight` parameter (so checkpoint
names and parameter counts are those of the model); formats of its own are buffers of the method.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LinearMethod(nn.Module):
    """Base: a dense matrix in the layer's `weight`, multiplied with PyTorch's GEMM."""

    # The checkpoint's block-quantised tensors are handed to `take_blocks` when the loader has
    # them (GGUF); only block methods want them.
    wants_blocks = False

    def take_blocks(self, layer: nn.Module, shard: int, blocks: tuple) -> None:
        raise NotImplementedError(f"{type(self).__name__} keeps no blocks")

    def finish(self, layer: nn.Module) -> None:
        """After every shard of the layer is loaded."""

    def kernel_for(self, rows: int) -> str:
        return "gemm"

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        w = layer.weight
        return F.linear(x if x.dtype == w.dtype else x.to(w.dtype), w, bias)

    def apply_grouped(self, layer: nn.Module, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """x [rows, in], rows sorted by group → [rows, out], rows of group g multiplied by
        `layer.weight[g]`: one GEMM per group with rows, none for the others."""
        w = layer.weight
        x = x if x.dtype == w.dtype else x.to(w.dtype)
        y = x.new_empty(x.shape[0], w.shape[1])
        start = 0
        for group, n in enumerate(counts):
            if n:
                torch.mm(x[start : start + n], w[group].t(), out=y[start : start + n])
            start += n
        return y

    def lookup(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of the matrix (an embedding lookup)."""
        return F.embedding(ids, layer.weight)


class DenseMethod(LinearMethod):
    """Weights in the model dtype (float32, bfloat16, float16): PyTorch's GEMM for every step."""


def dropped(weight: torch.Tensor) -> nn.Parameter:
    """What replaces a dense matrix once another format computes in its place: nothing held."""
    return nn.Parameter(torch.empty(0, dtype=weight.dtype, device=weight.device),
                        requires_grad=False)  # fmt: skip

"""A Mixture of Experts' router (which experts each token uses, and their weights) and the
sigmoid gate of a shared expert (layers/moe.py).

Both are held in float32 whatever the scheme: which experts run is decided here, and rounding
the router's weights would change the choice (it is experts x hidden, a sliver of the model).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Router(nn.Module):
    """Scores [tokens, experts] → each token's `top_k` experts and their weights (softmax over
    all experts, then the chosen ones, optionally renormalised to sum to 1), as HF computes.
    `bias`, `after_top_k` (gpt-oss): logits with a bias, the softmax over the chosen ones."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, normalize: bool,
                 bias: bool = False, after_top_k: bool = False):  # fmt: skip
        super().__init__()
        self.top_k, self.normalize, self.after_top_k = top_k, normalize, after_top_k
        self.weight = nn.Parameter(torch.empty(num_experts, hidden, dtype=torch.float32),
                                   requires_grad=False)  # fmt: skip
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(num_experts, dtype=torch.float32),
                                     requires_grad=False)  # fmt: skip

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x.float(), self.weight, self.bias)
        if self.after_top_k:
            top, experts = logits.topk(self.top_k, dim=-1)
            return top.softmax(dim=-1), experts
        probs = logits.softmax(dim=-1)
        weights, experts = probs.topk(self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, experts


class SharedGate(nn.Module):
    """sigmoid(x . w) per token: the share of the shared expert's output a token takes."""

    def __init__(self, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(1, hidden, dtype=torch.float32),
                                   requires_grad=False)  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(F.linear(x.float(), self.weight))

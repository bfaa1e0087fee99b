"""Token embedding and the LM head (which may share the embedding matrix)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, dim: int, dtype: torch.dtype, multiplier: float = 1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, dim, dtype=dtype), requires_grad=False)
        # Gemma multiplies by sqrt(hidden) rounded to the weight dtype, as HF does.
        self.multiplier = float(torch.tensor(multiplier, dtype=torch.float32).to(dtype))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = F.embedding(ids, self.weight)
        return x * self.multiplier if self.multiplier != 1.0 else x


class LMHead(nn.Module):
    """hidden → float32 logits. With `tied`, reads the embedding's matrix instead of its own."""

    def __init__(self, vocab_size: int, dim: int, dtype: torch.dtype, tied: VocabEmbedding | None):
        super().__init__()
        self.tied = tied is not None
        self.weight = (
            tied.weight
            if tied is not None
            else nn.Parameter(torch.empty(vocab_size, dim, dtype=dtype), requires_grad=False)
        )
        self.small_step = None  # see Linear.small_step

    def forward(self, hidden: torch.Tensor, softcap: float | None = None) -> torch.Tensor:
        if self.small_step is not None and hidden.shape[0] <= self.small_step.max_rows:
            logits = self.small_step(hidden)
        else:
            logits = F.linear(hidden, self.weight)
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        return logits.float()

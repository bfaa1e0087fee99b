"""Token embedding and the LM head (which may share the embedding matrix), both split along
the vocabulary under tensor parallelism."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inferd.distributed.state import SINGLE, TPGroup


def vocab_range(vocab_size: int, tp: TPGroup) -> tuple[int, int]:
    """(first id, rows) of this rank's vocabulary shard; every rank holds ceil(V / N) rows, the
    last one padded past the real vocabulary."""
    rows = -(-vocab_size // tp.world_size)
    return tp.rank * rows, rows


def load_vocab_rows(param: torch.Tensor, weight, vocab_size: int, tp: TPGroup) -> None:
    """Fill a vocabulary-sharded matrix from a lazy checkpoint weight (padding rows zero)."""
    start, rows = vocab_range(vocab_size, tp)
    real = max(0, min(rows, vocab_size - start))
    param[:real].copy_(weight.load(param.dtype, rows=(start, real)))
    param[real:].zero_()


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, dim: int, dtype: torch.dtype, multiplier: float = 1.0,
                 tp: TPGroup = SINGLE):  # fmt: skip
        super().__init__()
        self.vocab_size, self.tp = vocab_size, tp
        self.start, rows = vocab_range(vocab_size, tp)
        self.weight = nn.Parameter(torch.empty(rows, dim, dtype=dtype), requires_grad=False)
        # Gemma multiplies by sqrt(hidden) rounded to the weight dtype, as HF does.
        self.multiplier = float(torch.tensor(multiplier, dtype=torch.float32).to(dtype))

    def load(self, weight) -> None:
        load_vocab_rows(self.weight.data, weight, self.vocab_size, self.tp)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.enabled:
            local = ids - self.start
            outside = (local < 0) | (local >= self.weight.shape[0])
            x = F.embedding(local.masked_fill(outside, 0), self.weight)
            x = self.tp.all_reduce(x.masked_fill(outside[:, None], 0))
        else:
            x = F.embedding(ids, self.weight)
        return x * self.multiplier if self.multiplier != 1.0 else x


class LMHead(nn.Module):
    """hidden → float32 logits. With `tied`, reads the embedding's matrix instead of its own."""

    def __init__(self, vocab_size: int, dim: int, dtype: torch.dtype, tied: VocabEmbedding | None,
                 tp: TPGroup = SINGLE):  # fmt: skip
        super().__init__()
        self.vocab_size, self.tp = vocab_size, tp
        self.tied = tied is not None
        _, rows = vocab_range(vocab_size, tp)
        self.weight = (
            tied.weight
            if tied is not None
            else nn.Parameter(torch.empty(rows, dim, dtype=dtype), requires_grad=False)
        )
        self.small_step = None  # see Linear.small_step

    def load(self, weight) -> None:
        load_vocab_rows(self.weight.data, weight, self.vocab_size, self.tp)

    def forward(self, hidden: torch.Tensor, softcap: float | None = None) -> torch.Tensor:
        if self.small_step is not None and hidden.shape[0] <= self.small_step.max_rows:
            logits = self.small_step(hidden)
        else:
            logits = F.linear(hidden, self.weight)
        logits = logits.float()
        if self.tp.enabled:
            logits = self.tp.all_gather_last_dim(logits)[:, : self.vocab_size]
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        return logits

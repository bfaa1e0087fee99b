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


def load_vocab_blocks(weight, vocab_size: int, tp: TPGroup, dtype: torch.dtype):
    """This rank's vocabulary rows as a gguf BlockWeight (padding rows zero), computing large
    steps in `dtype`; None if the checkpoint tensor is not block-quantised."""
    from inferd.layers.gguf_blocks import BlockWeight

    if not hasattr(weight, "load_blocks"):
        return None
    start, rows = vocab_range(vocab_size, tp)
    real = max(0, min(rows, vocab_size - start))
    blocks = weight.load_blocks(rows=(start, real))
    if blocks is None:
        return None

    def padded(t):
        if t is None or real == rows:
            return t
        return torch.cat([t, t.new_zeros(rows - real, t.shape[1])])

    return BlockWeight(*map(padded, blocks), compute_dtype=dtype)


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, dim: int, dtype: torch.dtype, multiplier: float = 1.0,
                 tp: TPGroup = SINGLE):  # fmt: skip
        super().__init__()
        self.vocab_size, self.tp = vocab_size, tp
        self.start, rows = vocab_range(vocab_size, tp)
        self.weight = nn.Parameter(torch.empty(rows, dim, dtype=dtype), requires_grad=False)
        # Gemma multiplies by sqrt(hidden) rounded to the weight dtype, as HF does.
        self.multiplier = float(torch.tensor(multiplier, dtype=torch.float32).to(dtype))
        # `--quantization gguf`: set True before loading to keep the checkpoint's blocks.
        self.keep_blocks = False
        self.blocks = None

    def load(self, weight) -> None:
        blocks = None
        if self.keep_blocks:
            blocks = load_vocab_blocks(weight, self.vocab_size, self.tp, self.weight.dtype)
        if blocks is not None:
            self.use_blocks(blocks)
        else:
            load_vocab_rows(self.weight.data, weight, self.vocab_size, self.tp)

    def use_blocks(self, blocks) -> None:
        """Look rows up in a gguf BlockWeight instead of the dense matrix."""
        from inferd.layers.gguf_blocks import dropped

        self.blocks, self.weight = blocks, dropped(self.weight)

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if self.blocks is not None:
            return self.blocks.dequantized(ids)
        return F.embedding(ids, self.weight)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.enabled:
            rows = self.weight.shape[0] if self.blocks is None else self.blocks.shape[0]
            local = ids - self.start
            outside = (local < 0) | (local >= rows)
            x = self._lookup(local.masked_fill(outside, 0))
            x = self.tp.all_reduce(x.masked_fill(outside[:, None], 0))
        else:
            x = self._lookup(ids)
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
        self.keep_blocks = False  # see VocabEmbedding.keep_blocks

    def load(self, weight) -> None:
        blocks = None
        if self.keep_blocks:
            blocks = load_vocab_blocks(weight, self.vocab_size, self.tp, self.weight.dtype)
        if blocks is not None:
            self.use_blocks(blocks)
        else:
            load_vocab_rows(self.weight.data, weight, self.vocab_size, self.tp)

    def use_blocks(self, blocks) -> None:
        """Compute every step with a gguf BlockWeight instead of the dense matrix."""
        from inferd.layers.gguf_blocks import dropped

        self.small_step, self.weight = blocks, dropped(self.weight)

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

"""Token embedding and the LM head (which may share the embedding matrix), both split along
the vocabulary under tensor parallelism."""

from __future__ import annotations

import torch
from torch import nn

from inferd.distributed.state import SINGLE, TPGroup
from inferd.layers.gguf_blocks import BlockWeight, packed
from inferd.layers.weight_scheme import WeightScheme, as_scheme


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


def load_vocab_blocks(weight, vocab_size: int, tp: TPGroup) -> BlockWeight | None:
    """This rank's vocabulary rows as packed GGUF blocks, padding rows zero; None if the
    checkpoint tensor is not block-quantised."""
    load_blocks = getattr(weight, "load_blocks", None)  # GGUF weights have blocks
    if load_blocks is None:
        return None
    start, rows = vocab_range(vocab_size, tp)
    real = max(0, min(rows, vocab_size - start))
    cols = weight.shape[1]
    return packed(lambda first, n: load_blocks(rows=(start + first, n)), real, cols, rows)


def load_vocab(module: nn.Module, weight, vocab_size: int, tp: TPGroup) -> None:
    """Fill an embedding or LM head: in its method's own format when it takes the checkpoint's
    blocks and there are some, else densely into `module.weight`."""
    method = module.quant_method
    blocks = load_vocab_blocks(weight, vocab_size, tp) if method.wants_blocks else None
    if blocks is not None:
        method.take_blocks(module, 0, blocks)
    else:
        load_vocab_rows(module.weight.data, weight, vocab_size, tp)


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, dim: int, scheme: WeightScheme | torch.dtype,
                 multiplier: float = 1.0, tp: TPGroup = SINGLE):  # fmt: skip
        super().__init__()
        scheme = as_scheme(scheme)
        dtype = scheme.dtype
        self.vocab_size, self.tp = vocab_size, tp
        self.start, self.rows = vocab_range(vocab_size, tp)
        self.shard_sizes = [self.rows]
        self.weight = nn.Parameter(torch.empty(self.rows, dim, dtype=dtype), requires_grad=False)
        # Gemma multiplies by sqrt(hidden) rounded to the weight dtype, as HF does.
        self.multiplier = float(torch.tensor(multiplier, dtype=torch.float32).to(dtype))
        self.quant_method = scheme.linear_method("embedding")

    def load(self, weight) -> None:
        load_vocab(self, weight, self.vocab_size, self.tp)

    def finish_loading(self) -> None:
        self.quant_method.finish(self)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.enabled:
            local = ids - self.start
            outside = (local < 0) | (local >= self.rows)
            x = self.quant_method.lookup(self, local.masked_fill(outside, 0))
            x = self.tp.all_reduce(x.masked_fill(outside[:, None], 0))
        else:
            x = self.quant_method.lookup(self, ids)
        return x * self.multiplier if self.multiplier != 1.0 else x


class LMHead(nn.Module):
    """hidden → float32 logits. With `tied`, reads the embedding's matrix instead of its own
    (and, when the scheme says so, multiplies by the embedding's very method: same blocks)."""

    def __init__(self, vocab_size: int, dim: int, scheme: WeightScheme | torch.dtype,
                 tied: VocabEmbedding | None, tp: TPGroup = SINGLE):  # fmt: skip
        super().__init__()
        scheme = as_scheme(scheme)
        self.vocab_size, self.tp = vocab_size, tp
        self.tied = tied is not None
        _, rows = vocab_range(vocab_size, tp)
        self.shard_sizes = [rows]
        self.weight = (
            tied.weight
            if tied is not None
            else nn.Parameter(torch.empty(rows, dim, dtype=scheme.dtype), requires_grad=False)
        )
        self.shares_method = tied is not None and scheme.head_shares_embedding()
        self.quant_method = (
            tied.quant_method if self.shares_method else scheme.linear_method("head")
        )

    def load(self, weight) -> None:
        load_vocab(self, weight, self.vocab_size, self.tp)

    def finish_loading(self, embedding: VocabEmbedding) -> None:
        """After the embedding is loaded and finished too (a tied head reads its matrix)."""
        if self.tied:
            self.weight = embedding.weight  # it may have been replaced (blocks drop it)
        if not self.shares_method:
            self.quant_method.finish(self)

    def forward(self, hidden: torch.Tensor, softcap: float | None = None) -> torch.Tensor:
        logits = self.quant_method.apply(self, hidden).float()
        if self.tp.enabled:
            logits = self.tp.all_gather_last_dim(logits)[:, : self.vocab_size]
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        return logits

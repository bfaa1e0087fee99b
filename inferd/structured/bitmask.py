"""Token bitmasks and applying them to logits.

Layout (llguidance's and xgrammar's): one row of int32 words per constrained position; token t is
allowed when bit t % 32 of word t // 32 is set. Rows live on the CPU (llguidance writes them).

Applying a row means setting the logits of the banned tokens to -inf. With a boolean mask
(`masked_fill`) that costs about a millisecond per 262,144-wide row on a CPU: the mask bits are
random, so every element is a mispredicted branch. `LogitsMasker` instead expands each mask byte
through a 256-entry table into eight floats (+inf for allowed, -inf for banned) and takes the
elementwise minimum with the logits: branch-free, a small fraction of that cost. Only the rows
named are touched, so unconstrained rows of the batch pay nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def allocate_bitmask(rows: int, words: int) -> torch.Tensor:
    """A CPU int32 [rows, words] bitmask, every token allowed. Pinned when CUDA is present, so
    copying it to the device does not stall."""
    pin = torch.cuda.is_available()
    return torch.full((rows, words), -1, dtype=torch.int32, pin_memory=pin)


def bitmask_allows(row: torch.Tensor, token: int) -> bool:
    """Whether `row` (one bitmask row) allows `token`."""
    token = int(token)
    if not 0 <= token < row.shape[-1] * 32:
        return False
    return bool((int(row[token >> 5]) >> (token & 31)) & 1)


def _byte_table() -> np.ndarray:
    """[256, 8] float32: entry [b, i] is +inf when bit i of byte b is set, else -inf."""
    bits = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little")
    return np.where(bits == 1, np.inf, -np.inf).astype(np.float32)


class LogitsMasker:
    """Applies bitmask rows to rows of a [batch, vocab] logits tensor, in place.

    Keeps a scratch buffer between calls: use one masker per thread (the engine loop's)."""

    def __init__(self, vocab_size: int, words: int):
        if words * 32 < 1 or vocab_size < 1:
            raise ValueError("vocab_size and words must be positive")
        self.vocab_size = vocab_size
        self.words = words
        self._table = _byte_table()
        self._table.setflags(write=False)
        self._scratch = np.empty((words * 4, 8), dtype=np.float32)
        self._device_tables: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int]) -> None:
        """`logits[rows[j]]` gets `bitmask[j]`: banned tokens' logits become -inf.
        `bitmask` has len(rows) rows (or more; the first len(rows) are used)."""
        if not rows:
            return
        if logits.dim() != 2 or logits.shape[1] != self.vocab_size:
            raise ValueError(
                f"logits must be [batch, {self.vocab_size}], got {tuple(logits.shape)}"
            )
        if bitmask.dtype != torch.int32 or bitmask.dim() != 2 or bitmask.shape[1] != self.words:
            raise ValueError(f"bitmask must be int32 [rows, {self.words}]")
        if bitmask.shape[0] < len(rows):
            raise ValueError(f"bitmask has {bitmask.shape[0]} rows for {len(rows)} logits rows")
        covered = min(self.vocab_size, self.words * 32)
        if logits.device.type == "cpu" and logits.dtype == torch.float32:
            self._apply_cpu(logits, bitmask, rows, covered)
        else:
            self._apply_torch(logits, bitmask, rows, covered)
        if covered < self.vocab_size:  # ids past the tokenizer's: never allowed
            logits[list(rows), covered:] = float("-inf")

    def _apply_cpu(
        self, logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int], covered: int
    ) -> None:
        masks = bitmask.cpu().numpy().view(np.uint8)  # little-endian: byte k holds tokens 8k..
        bias = self._scratch.reshape(-1)[:covered]
        for j, r in enumerate(rows):
            np.take(self._table, masks[j], axis=0, out=self._scratch)
            target = logits[r, :covered]
            # NOTE: numpy, not torch: one row is too little work to share, and torch's
            # intra-op pool turns it into milliseconds when its other thread is descheduled
            # (a busy machine), right between two model steps.
            if target.is_contiguous() and not target.requires_grad:
                row = target.numpy()
                np.minimum(row, bias, out=row)
            else:
                torch.minimum(target, torch.from_numpy(bias), out=target)

    def _apply_torch(
        self, logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int], covered: int
    ) -> None:
        key = (logits.device, logits.dtype)
        table = self._device_tables.get(key)
        if table is None:
            table = torch.tensor(self._table, device=logits.device, dtype=logits.dtype)
            self._device_tables[key] = table
        # NOTE: a blocking copy: the caller refills the (pinned) bitmask right after this returns.
        masks = bitmask[: len(rows)].to(logits.device)
        index = masks.view(torch.uint8).reshape(-1).to(torch.int32)
        bias = table.index_select(0, index).view(len(rows), -1)[:, :covered]
        idx = torch.tensor(list(rows), device=logits.device)
        logits[idx, :covered] = torch.minimum(logits[idx, :covered], bias)

"""Grammar bitmasks as a logits processor of the sampler (structured outputs).

A constrained row arrives with its bitmask (the step record's `grammar_bitmasks`, filled by the
scheduler from the sample's matcher). Two ways to apply it, chosen per row:

- mask first (vLLM's way): the banned tokens' logits become -inf before anything else; the row's
  logprobs are then those of the masked distribution. Sampled rows and rows asking for logprobs.
- check first (llama.cpp's trick): take the greedy argmax as if unconstrained, look the token up
  in the bitmask (one bit), and only when it is banned mask the row and take the argmax again.
  Most tokens of a model that follows its instructions are allowed, so most steps cost one
  lookup instead of a pass over a 262,144-wide row.

For a greedy row both give exactly the same token: the masked argmax is the unmasked one whenever
that one is allowed, and the sampler's other processors (bias, penalties, min_tokens, allowed
ids) act on each token alone, so masking commutes with them. For a sampled row they would differ
in distribution, so sampled rows are always masked first.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from inferd.engine.sampling.structured_outputs import ConstraintStats
from inferd.structured.bitmask import LogitsMasker


def allows(mask: bytes, token: int) -> bool:
    """Bit token % 32 of int32 word token // 32 (little-endian)."""
    byte = token >> 3
    return 0 <= byte < len(mask) and bool((mask[byte] >> (token & 7)) & 1)


class GrammarMasks:
    def __init__(self, stats: ConstraintStats | None = None):
        self.stats = stats or ConstraintStats()
        self._maskers: dict[tuple[int, int], LogitsMasker] = {}

    @staticmethod
    def split(rows) -> tuple[list[int], list[int]]:
        """(rows to check first, rows to mask first) among the constrained ones."""
        checked, masked = [], []
        for i, r in enumerate(rows):
            if r.grammar_mask is not None:
                first = r.params.greedy and r.params.logprobs is None
                (checked if first else masked).append(i)
        return checked, masked

    def apply(self, x: torch.Tensor, rows, which: list[int]) -> None:
        """Mask rows `which` of `x` in place with their rows' bitmasks."""
        start = time.perf_counter()
        words = len(rows[which[0]].grammar_mask) // 4
        masker = self._maskers.get((x.shape[1], words))
        if masker is None:
            masker = self._maskers[x.shape[1], words] = LogitsMasker(x.shape[1], words)
        bits = b"".join(rows[i].grammar_mask for i in which)
        table = torch.from_numpy(
            np.frombuffer(bytearray(bits), dtype=np.int32).reshape(len(which), words)
        )
        masker.apply(x, table, which)
        self.stats.masked += len(which)
        self.stats.constrain_s += time.perf_counter() - start

    def check(self, x: torch.Tensor, rows, which: list[int], token_ids: list[int]) -> None:
        """Greedy rows `which` of `x` (after the other processors) took `token_ids`: those
        their grammar refuses take the argmax of their masked row instead (in place)."""
        start = time.perf_counter()
        refused = [i for i in which if not allows(rows[i].grammar_mask, token_ids[i])]
        self.stats.checked += len(which)
        self.stats.rejected += len(refused)
        self.stats.constrain_s += time.perf_counter() - start
        if not refused:
            return
        # NOTE: index_select copies: `x` may be the caller's logits, which are never written.
        picked = x.index_select(0, torch.tensor(refused, device=x.device))
        self.apply(picked, [rows[i] for i in refused], list(range(len(refused))))
        for i, token in zip(refused, picked.argmax(dim=-1).tolist(), strict=True):
            token_ids[i] = token

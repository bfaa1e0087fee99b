"""Sampling a batch in which some rows follow a grammar.

Two ways to constrain a row, chosen per row by the caller:

- mask first (vLLM's way): fill the row's bitmask, set its banned logits to -inf, sample.
  Costs a mask computation and an apply per row per step.
- check first (llama.cpp's trick): sample as if unconstrained, ask the matcher whether the token
  is allowed (a few µs), and only when it is not, mask the row and sample it again. Most tokens
  of a model that follows its instructions are allowed, so most steps cost one check.

For a greedy row both give exactly the same token: the masked argmax is the unmasked one whenever
that one is allowed, and the sampler's logit processors (bias, penalties, min_tokens) act on each
token alone, so masking commutes with them. For a sampled row they differ in distribution (a
resample draws fresh noise, and top-k/top-p sets shift under the mask), so the engine should
check first only where `params.greedy`.

Neither path advances the matchers: after the step the engine (scheduler side) calls
`matcher.accept_tokens([token])`, as for any generated token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from inferd.structured.bitmask import LogitsMasker, allocate_bitmask
from inferd.structured.matcher import GrammarMatcher
from inferd.structured.tokenizer_info import TokenizerInfo

# (logits rows, their indices in the batch) -> one token id per row. The engine's sampler, with
# each row's own SamplingRow.
SampleFn = Callable[[torch.Tensor, list[int]], list[int]]


@dataclass
class ConstraintStats:
    """Counts since creation: what the constraints cost."""

    checked: int = 0  # tokens sampled unmasked and checked
    rejected: int = 0  # of those, resampled under a mask
    masked: int = 0  # rows masked before sampling (mask-first rows and rejected ones)
    tokens: int = 0  # constrained tokens accepted by their grammar (the engine counts them)
    constrain_s: float = 0.0  # seconds in checks and masks (the sampler's own time excluded)
    accept_s: float = 0.0  # seconds advancing grammars over sampled tokens (the engine's)


class ConstrainedSampling:
    """Applies each constrained row's grammar around the engine's sampler (one per engine)."""

    def __init__(self, info: TokenizerInfo, max_rows: int = 256):
        self.info = info
        self.masker = LogitsMasker(info.vocab_size, info.bitmask_words)
        self._bitmask = allocate_bitmask(max_rows, info.bitmask_words)
        self.stats = ConstraintStats()

    def sample(
        self,
        logits: torch.Tensor,
        matchers: Sequence[GrammarMatcher | None],
        sample: SampleFn,
        check_first: Sequence[bool] | bool = True,
    ) -> list[int]:
        """Token ids for every row of `logits` [batch, vocab]; rows whose matcher is None are
        sampled as they are. NOTE: masked rows of `logits` are changed in place (keep a copy if
        the unmasked values are needed, e.g. for logprobs)."""
        if len(matchers) != logits.shape[0]:
            raise ValueError(f"{len(matchers)} matchers for {logits.shape[0]} logits rows")
        if isinstance(check_first, bool):
            check_first = [check_first] * len(matchers)
        start = time.perf_counter()
        constrained = [i for i, m in enumerate(matchers) if m is not None]
        self._mask([i for i in constrained if not check_first[i]], logits, matchers)
        sampling = time.perf_counter()
        tokens = list(sample(logits, list(range(logits.shape[0]))))
        sampled = time.perf_counter()
        checked = [i for i in constrained if check_first[i]]
        rejected = [i for i in checked if not matchers[i].allows(tokens[i])]
        self.stats.checked += len(checked)
        self.stats.rejected += len(rejected)
        if rejected:
            self._mask(rejected, logits, matchers)
            resampling = time.perf_counter()
            # NOTE: row by row, on views: gathering the rows would copy whole vocabulary-wide
            # rows with torch's thread pool, which costs more than the resample itself.
            for i in rejected:
                tokens[i] = sample(logits[i : i + 1], [i])[0]
            sampled += time.perf_counter() - resampling  # the sampler's time is not the mask's
        self.stats.constrain_s += (sampling - start) + (time.perf_counter() - sampled)
        return tokens

    def _mask(
        self,
        rows: list[int],
        logits: torch.Tensor,
        matchers: Sequence[GrammarMatcher | None],
    ) -> None:
        for start in range(0, len(rows), self._bitmask.shape[0]):
            chunk = rows[start : start + self._bitmask.shape[0]]
            for j, i in enumerate(chunk):
                matchers[i].fill_bitmask(self._bitmask, j)
            self.masker.apply(logits, self._bitmask, chunk)
        self.stats.masked += len(rows)

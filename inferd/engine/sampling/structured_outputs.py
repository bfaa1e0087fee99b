"""The engine core's side of structured outputs: compile each request's grammar off the loop
thread, and keep its state on the request, where the scheduler reads it.

    add_request ── submit(spec) ──▶ GrammarManager worker thread (compile, cached by spec)
                   req.grammar = the GrammarCompilation (its future, and what to do with it)
    schedule()  ── grammar ready? every sample gets its own GrammarMatcher (n > 1: each its own)
                ── a sampled row of a constrained sample: its token bitmask, in the step record
    sampling    ── the sampler applies the bitmask as a logits processor
    (engine/sampling/grammar_mask.py) update_from_output() ── accept(seq, token): the matcher
    follows every appended token

The tokenizer info (the vocabulary as llguidance sees it, seconds to build the first time) is
built on the first compilation, in the manager's worker thread: an engine that never sees a
constrained request never pays for it.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inferd.errors import InvalidRequest
from inferd.structured_params import StructuredOutputsParams

if TYPE_CHECKING:
    from inferd.engine.scheduling.request import Sequence
    from inferd.structured.manager import GrammarManager
    from inferd.structured.matcher import GrammarMatcher


@dataclass
class ConstraintStats:
    """Counts since the engine started: what the constraints cost."""

    checked: int = 0  # greedy rows sampled unmasked and checked against their bitmask
    rejected: int = 0  # of those, masked and sampled again
    masked: int = 0  # rows masked before sampling (mask-first rows and rejected ones)
    tokens: int = 0  # constrained tokens accepted by their grammar
    constrain_s: float = 0.0  # seconds the sampler spent checking and masking
    accept_s: float = 0.0  # seconds advancing grammars over sampled tokens
    bitmask_s: float = 0.0  # seconds computing the bitmasks of the step records


class StructuredOutputs:
    def __init__(self, tokenizer, vocab_size: int, stats: ConstraintStats | None = None):
        self._tokenizer, self._vocab_size = tokenizer, vocab_size
        self._manager: GrammarManager | None = None
        self.stats = stats or ConstraintStats()

    @property
    def manager(self) -> GrammarManager:
        """Made on the first constrained request. NOTE: importing the grammar engine
        (llguidance) costs a tenth of a second, which no start should pay before it is needed."""
        if self._manager is None:
            from inferd.structured.manager import GrammarManager
            from inferd.structured.tokenizer_info import build_tokenizer_info

            tokenizer, vocab_size = self._tokenizer, self._vocab_size
            self._manager = GrammarManager(lambda: build_tokenizer_info(tokenizer, vocab_size))
        return self._manager

    def submit(self, spec: StructuredOutputsParams) -> GrammarCompilation:
        """Start compiling `spec` (or share its cached compilation); never blocks (any
        thread)."""
        return GrammarCompilation(self, self.manager.submit(spec), spec)

    def shutdown(self) -> None:
        if self._manager is not None:
            self._manager.shutdown()


class GrammarCompilation:
    """One request's grammar: a compilation that may still run, then matchers from it."""

    def __init__(self, owner: StructuredOutputs, future: Future, spec: StructuredOutputsParams):
        self._owner, self.future, self.spec = owner, future, spec

    def done(self) -> bool:
        return self.future.done()

    def add_done_callback(self, callback) -> None:
        self.future.add_done_callback(lambda _: callback(self))

    def check(self) -> None:
        """Raise the compilation's error as an InvalidRequest (it must be done)."""
        error = self.future.exception()
        if error is None:
            return
        if isinstance(error, InvalidRequest):
            raise error
        # The model's tokenizer cannot be used by the grammar engine: not the spec's fault,
        # but still nothing this server can do for the request.
        field = self.spec.field_name()
        raise InvalidRequest(field, f"{field}: structured outputs are unavailable: {error}")

    def new_matcher(self) -> GrammarMatcher:
        return self._owner.manager.matcher(self.future)

    def bitmask(self, matcher: GrammarMatcher) -> bytes:
        """The tokens `matcher` allows next, as the step record carries them."""
        import torch

        start = time.perf_counter()
        words = self._owner.manager.info.bitmask_words
        row = torch.empty((1, words), dtype=torch.int32)
        matcher.fill_bitmask(row, 0)
        self._owner.stats.bitmask_s += time.perf_counter() - start
        return row.numpy().tobytes()

    def accept(self, seq: Sequence, token: int) -> None:
        """The sample's matcher follows the appended token. A token the grammar refuses means
        the sampler broke its contract: raised, so the step fails rather than the reply silently
        leaving its grammar."""
        stats = self._owner.stats
        start = time.perf_counter()
        accepted = seq.matcher.accept_tokens([token])
        stats.accept_s += time.perf_counter() - start
        stats.tokens += accepted
        if not accepted:
            raise RuntimeError(
                f"sequence {seq.seq_id}: the sampled token {token} is not allowed by its grammar"
            )
        if seq.matcher.error:
            raise RuntimeError(f"sequence {seq.seq_id}: grammar error: {seq.matcher.error}")

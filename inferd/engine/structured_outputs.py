"""The engine's side of structured outputs: compile each request's grammar off the loop thread,
give each constrained sequence its matcher, and constrain the sampling of their rows.

    add_request ── submit(spec) ──▶ GrammarManager worker thread (compile, cached by spec)
    schedule()  ── grammar ready? attach(req): one GrammarMatcher per sample (n > 1: each its own)
    execute()   ── sample(): unconstrained rows as before; constrained rows masked (sampled rows,
                   rows asking for logprobs) or checked first (greedy rows: llama.cpp's trick)
    update_from_output() ── advance(seq, token): the matcher accepts every appended token

The tokenizer info (the vocabulary as llguidance sees it, seconds to build the first time) is
built on the first compilation, in the manager's worker thread: an engine that never sees a
constrained request never pays for it.

Logprobs of a constrained row are those of the masked distribution (vLLM applies the grammar's
bitmask to the logits before its sampler computes logprobs): such rows are always masked first,
so the reported numbers do not depend on which path sampled the token.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import TYPE_CHECKING

import torch

from inferd.errors import InvalidRequest
from inferd.structured_params import StructuredOutputsParams

if TYPE_CHECKING:
    from inferd.engine.request import Request, Sequence
    from inferd.engine.sampler import Sampler, SampleResult, SamplingRow
    from inferd.structured.manager import GrammarManager
    from inferd.structured.sampling import ConstrainedSampling


class StructuredOutputs:
    def __init__(self, tokenizer, vocab_size: int, max_rows: int = 256):
        self._tokenizer, self._vocab_size = tokenizer, vocab_size
        self._manager: GrammarManager | None = None
        self._max_rows = max_rows
        self._sampling: ConstrainedSampling | None = None

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

    # ---- compiling (any thread) -----------------------------------------------------------------
    def submit(self, spec: StructuredOutputsParams) -> Future:
        """Start compiling `spec` (or share its cached compilation); never blocks. `check`
        turns the future's exception, once done, into the InvalidRequest to raise."""
        return self.manager.submit(spec)

    def check(self, handle: Future, spec: StructuredOutputsParams) -> None:
        """Raise the compilation's error as an InvalidRequest (the handle must be done)."""
        error = handle.exception()
        if error is None:
            return
        if isinstance(error, InvalidRequest):
            raise error
        # The model's tokenizer cannot be used by the grammar engine: not the spec's fault,
        # but still nothing this server can do for the request.
        field = spec.field_name()
        raise InvalidRequest(field, f"{field}: structured outputs are unavailable: {error}")

    # ---- the loop thread ------------------------------------------------------------------------
    def attach(self, req: Request) -> None:
        """Give every sample of `req` (started or still waiting to fork) a fresh matcher.
        Raises the request's InvalidRequest when its grammar did not compile."""
        spec = req.params.structured_outputs
        self.check(req.grammar, spec)
        for seq in [*req.sequences, *req.forks]:
            seq.matcher = self.manager.matcher(req.grammar)

    def advance(self, seq: Sequence, token: int) -> None:
        """The matcher follows the appended token. A token the grammar refuses means the
        sampler broke its contract: raised, so the step fails rather than the reply silently
        leaving its grammar."""
        start = time.perf_counter()
        accepted = seq.matcher.accept_tokens([token])
        if self._sampling is not None:  # None only when a test drives the scheduler alone
            self._sampling.stats.accept_s += time.perf_counter() - start
            self._sampling.stats.tokens += accepted
        if not accepted:
            raise RuntimeError(
                f"sequence {seq.seq_id}: the sampled token {token} is not allowed by its grammar"
            )
        if seq.matcher.error:
            raise RuntimeError(f"sequence {seq.seq_id}: grammar error: {seq.matcher.error}")

    def sample(
        self, sampler: Sampler, logits: torch.Tensor, rows: list[SamplingRow]
    ) -> SampleResult:
        """The sampler's result for `rows`, each constrained row following its grammar.
        NOTE: constrained rows of `logits` are masked in place (the executor's own copy)."""
        matchers = [r.matcher for r in rows]
        if all(m is None for m in matchers):
            return sampler(logits, rows)
        if self._sampling is None:
            from inferd.structured.sampling import ConstrainedSampling

            self._sampling = ConstrainedSampling(self.manager.info, self._max_rows)
        # Check first only where the result is exactly the masked one and nothing else reads
        # the logits: greedy rows without logprobs (see inferd/structured/sampling.py).
        check_first = [r.params.greedy and r.params.logprobs is None for r in rows]
        first: list[SampleResult] = []

        def sample_fn(x: torch.Tensor, index: list[int]) -> list[int]:
            result = sampler(x, [rows[i] for i in index])
            if not first:
                first.append(result)
            return result.token_ids

        token_ids = self._sampling.sample(logits, matchers, sample_fn, check_first)
        # NOTE: resampled rows are greedy rows without logprobs: the first call's logprobs stand.
        return type(first[0])(token_ids, first[0].logprobs)

    @property
    def stats(self):
        """What the constraints cost so far (checked, rejected, masked rows), or None."""
        return None if self._sampling is None else self._sampling.stats

    def shutdown(self) -> None:
        if self._manager is not None:
            self._manager.shutdown()

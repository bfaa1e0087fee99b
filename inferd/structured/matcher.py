"""One sequence's position in its grammar: which tokens may come next, and advancing on the
tokens the sampler chose.

The engine owns one GrammarMatcher per constrained sequence (n > 1 gives each its own). After
every step it calls `accept_tokens` with the sampled token(s); before sampling it either fills a
bitmask row (`fill_bitmask`) or, on the check-first path, asks `allows(token)` and fills the row
only when the answer is no. A speculative step accepts several tokens at once and `rollback`s the
rejected ones.

Once the grammar is complete, only the EOS ids (the tokenizer's EOS and end-of-turn) are allowed;
accepting one terminates the matcher.
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import torch

from inferd.structured.tokenizer_info import TokenizerInfo


class GrammarMatcher:
    def __init__(self, matcher: llguidance.LLMatcher, info: TokenizerInfo):
        self._m = matcher
        self._eos = frozenset(info.eos_token_ids)
        self._words = info.bitmask_words
        self._n_tokens = info.ll_tokenizer.vocab_size
        # Per accepted token: whether llguidance counted it. NOTE: llguidance does not record an
        # EOS taken after the grammar has stopped, so `rollback(n)` must skip those (else it
        # would undo one real token too many).
        self._counted: list[bool] = []
        self._terminated = False

    # --- advancing -------------------------------------------------------------------------------

    def accept_tokens(self, tokens: Sequence[int]) -> bool:
        """Advance over `tokens` (one per decode step; several for speculative decoding).
        All or nothing: if any token is not allowed (nothing is, after an EOS), the state is
        left as it was and False is returned."""
        done = 0
        for t in tokens:
            t = int(t)
            if not self.allows(t):
                self.rollback(done)
                return False
            stopped = self._m.is_stopped()
            if not self._m.consume_token(t):
                raise RuntimeError(f"llguidance rejected an allowed token: {self._m.get_error()}")
            self._counted.append(not (stopped and t in self._eos))
            self._terminated = t in self._eos
            done += 1
        return True

    def allows(self, token: int) -> bool:
        """Whether `token` may come next (a few µs: no mask is computed)."""
        token = int(token)
        # NOTE: llguidance must never see an id outside its vocabulary (a padded model vocab has
        # them): its validate_tokens then puts the matcher in an error state, which allows EOS.
        if self._terminated or not 0 <= token < self._n_tokens:
            return False
        if token in self._eos:
            # NOTE: once stopped, llguidance's validate_tokens says no to EOS, yet takes it.
            return self._m.is_stopped() or self._m.validate_tokens([token]) == 1
        return self._m.validate_tokens([token]) == 1

    def validate_tokens(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, from the first, would be accepted (a draft's valid prefix);
        the state is unchanged afterwards."""
        n = 0
        for t in tokens:
            if not self.accept_tokens([t]):
                break
            n += 1
        self.rollback(n)
        return n

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""
        if not 0 <= num_tokens <= len(self._counted):
            raise ValueError(
                f"cannot roll back {num_tokens} tokens: {len(self._counted)} were accepted"
            )
        if num_tokens == 0:
            return
        undone = self._counted[-num_tokens:]
        del self._counted[-num_tokens:]
        counted = sum(undone)
        if counted and not self._m.rollback(counted):
            raise RuntimeError(f"llguidance could not roll back: {self._m.get_error()}")
        self._terminated = False

    # --- state -----------------------------------------------------------------------------------

    @property
    def is_terminated(self) -> bool:
        """An EOS id has been accepted: the constrained reply is over."""
        return self._terminated

    @property
    def is_complete(self) -> bool:
        """The text so far matches the whole grammar (EOS would be allowed now)."""
        return self._m.is_accepting() or self._m.is_stopped()

    @property
    def num_accepted(self) -> int:
        return len(self._counted)

    @property
    def error(self) -> str | None:
        message = self._m.get_error()
        return message or None

    def clone(self) -> GrammarMatcher:
        """An independent copy in the same state."""
        twin = GrammarMatcher.__new__(GrammarMatcher)
        twin._m = self._m.deep_copy()
        twin._eos, twin._words, twin._n_tokens = self._eos, self._words, self._n_tokens
        twin._counted, twin._terminated = list(self._counted), self._terminated
        return twin

    # --- bitmasks --------------------------------------------------------------------------------

    def fill_bitmask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        """Write the allowed next tokens into `bitmask[row]` (CPU int32, contiguous rows of
        `bitmask_words` words). A terminated matcher allows nothing but EOS."""
        _check_bitmask(bitmask, row, self._words)
        target = bitmask[row]
        self._m.unsafe_compute_mask_ptr(target.data_ptr(), self._words * 4)

    def fill_bitmask_rows(self, bitmask: torch.Tensor, row: int, draft: Sequence[int]) -> int:
        """Speculative decoding: row `row` for the current position, then row `row + i + 1` for
        the position after draft token i, as long as the draft stays valid. Returns the rows
        filled (1 + the valid draft prefix); the state is unchanged afterwards."""
        self.fill_bitmask(bitmask, row)
        filled = 1
        for t in draft:
            if not self.accept_tokens([t]):
                break
            self.fill_bitmask(bitmask, row + filled)
            filled += 1
        self.rollback(filled - 1)
        return filled


def _check_bitmask(bitmask: torch.Tensor, row: int, words: int) -> None:
    # NOTE: llguidance writes through a raw pointer: a wrong shape or device would corrupt memory.
    if bitmask.dtype != torch.int32 or bitmask.device.type != "cpu" or bitmask.dim() != 2:
        raise ValueError("bitmask must be a 2-D int32 CPU tensor")
    if bitmask.shape[1] != words or not bitmask.is_contiguous():
        raise ValueError(f"bitmask rows must be contiguous with {words} words")
    if not 0 <= row < bitmask.shape[0]:
        raise IndexError(f"bitmask row {row} out of range ({bitmask.shape[0]} rows)")

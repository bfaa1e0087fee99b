"""N-gram prompt lookup: draft tokens for a sequence from its own earlier tokens.

For a sequence t[0:L] (prompt + output), take its last n tokens, n from `prompt_lookup_max` down
to `prompt_lookup_min`; the first n whose n-gram occurred earlier wins, and the draft is what
followed its most recent earlier occurrence, up to k tokens. vLLM's proposer searches the whole
sequence every step; here each sequence keeps an index instead, a dictionary per n from n-gram to
the end of its most recent occurrence, updated with the tokens appended since the last call. A
proposal is then a few dictionary probes whatever the sequence length, and the index costs one
entry per token and n (built once for the prompt, then extended a few tokens per step).

When the match ends less than k tokens before the end (a periodic tail, "ab ab ab"), the draft
reads on past the end through itself: what followed the match is the tail, and what follows the
tail is, by the same match, the tail again. So the draft always has min(k, room) tokens.
"""

from __future__ import annotations

from collections.abc import Hashable

from inferd.spec_decode.config import SpeculativeConfig


class NgramIndex:
    """For one sequence whose tokens only ever grow: for each n in [min_n, max_n], where the most
    recent occurrence of every n-gram ends, not counting the n-gram the sequence ends with.

    Keys are Python's hash of the n-gram tuple (half the memory of the tuples); a hit is checked
    against the tokens, so a collision can only cost a missed proposal, never a wrong one."""

    __slots__ = ("min_n", "max_n", "_last", "_indexed")

    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self._last: list[dict[int, int]] = [{} for _ in range(max_n - min_n + 1)]
        # Every n-gram ending before this position is in the index.
        self._indexed = 0

    def sync(self, tokens: list[int]) -> None:
        """Index the n-grams that end before the last position of `tokens` (a list that has only
        grown since the previous call: the prefix indexed before must be unchanged)."""
        if len(tokens) < self._indexed:  # the tokens shrank: start over rather than lie
            self._last = [{} for _ in self._last]
            self._indexed = 0
        start = self._indexed
        end = len(tokens) - 1  # the n-gram ending at len(tokens) is the query, not indexed
        if end < start:
            return
        for n, last in zip(range(self.min_n, self.max_n + 1), self._last, strict=True):
            first = max(start, n)  # the first end position an n-gram can have
            if first > end:
                continue
            if end + 1 - first > 8:  # bulk (the prompt): zip builds the tuples in C
                window = tokens[first - n : end]
                grams = zip(*(window[j : len(window) - n + 1 + j] for j in range(n)))
                last.update(zip(map(hash, grams), range(first, end + 1)))
            else:
                for e in range(first, end + 1):
                    last[hash(tuple(tokens[e - n : e]))] = e
        self._indexed = end + 1

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the most recent earlier occurrence of the longest
        matching suffix n-gram; [] when none matches. `sync(tokens)` must have run."""
        length = len(tokens)
        if k <= 0 or length < self.min_n + 1:
            return []
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            suffix = tokens[length - n :]
            end = self._last[n - self.min_n].get(hash(tuple(suffix)))
            if end is None or tokens[end - n : end] != suffix:
                continue
            follow = tokens[end : end + k]
            if len(follow) < k:  # periodic tail: continue through the draft itself
                follow = (follow * (k // len(follow) + 1))[:k]
            return list(follow)
        return []

    def __len__(self) -> int:
        return sum(len(d) for d in self._last)


def draft_room(num_tokens: int, num_output_tokens: int, max_tokens: int, max_model_len: int) -> int:
    """The most drafts worth verifying: a step that accepts all d drafts emits d + 1 tokens, and
    the sequence may emit only up to `max_tokens` outputs and `max_model_len` tokens in all (the
    limits at which the scheduler ends it). Never negative."""
    can_emit = min(max_tokens - num_output_tokens, max_model_len - num_tokens)
    return max(0, can_emit - 1)


class NgramProposer:
    """The drafts of every running sequence, from each sequence's own index.

    Per decode step of a sequence: `propose(seq_id, token_ids, room)`; when it finishes or is
    aborted: `forget(seq_id)` (the index is small but lives until then). Preemption keeps the
    index: the tokens stay. Which of the drafts are worth verifying is the planner's call
    (planner.py)."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self._indexes: dict[Hashable, NgramIndex] = {}

    def propose(self, seq_id: Hashable, token_ids: list[int], room: int) -> list[int]:
        """Draft token ids for the step after `token_ids` (prompt + output so far, a list that
        only grows), at most min(num_speculative_tokens, room) of them (`draft_room`); [] when
        nothing matches. Calling it again for the same tokens (a step that did not get
        scheduled) returns the same draft and changes nothing."""
        index = self._indexes.get(seq_id)
        if index is None:
            c = self.config
            index = self._indexes[seq_id] = NgramIndex(c.prompt_lookup_min, c.prompt_lookup_max)
        index.sync(token_ids)
        k = min(self.config.num_speculative_tokens, room)
        return index.lookup(token_ids, k) if k > 0 else []

    def forget(self, seq_id: Hashable) -> None:
        self._indexes.pop(seq_id, None)

    def __len__(self) -> int:
        """Sequences with an index (for leak checks)."""
        return len(self._indexes)

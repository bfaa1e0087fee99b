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

from inferd.spec_decode.adaptive import AdaptiveSettings, DraftGate
from inferd.spec_decode.config import SpeculativeConfig

DEFAULT_ADAPTIVE = AdaptiveSettings()  # frozen: a shared default, not shared state


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
    limits at which stopping.py ends it). Never negative."""
    can_emit = min(max_tokens - num_output_tokens, max_model_len - num_tokens)
    return max(0, can_emit - 1)


class _SequenceDrafts:
    __slots__ = ("index", "gate", "shadow", "shadow_at")

    def __init__(self, config: SpeculativeConfig, adaptive: AdaptiveSettings | None) -> None:
        self.index = NgramIndex(config.prompt_lookup_min, config.prompt_lookup_max)
        self.gate = DraftGate(adaptive) if adaptive is not None else None
        self.shadow: list[int] = []  # while the gate is off: the draft being scored
        self.shadow_at = 0  # the sequence length the shadow was proposed at

    def score_shadow(self, tokens: list[int]) -> None:
        """Compare the pending shadow with the tokens decoded since; once it is decided (a
        mismatch, or all of it matched), hand its score to the gate."""
        arrived = tokens[self.shadow_at : self.shadow_at + len(self.shadow)]
        matched = 0
        while matched < len(arrived) and arrived[matched] == self.shadow[matched]:
            matched += 1
        if matched < len(arrived) or matched == len(self.shadow):
            self.gate.record_shadow(len(self.shadow), matched)
            self.shadow = []


class NgramProposer:
    """The drafts of every running sequence, with each sequence's index and adaptive gate.

    Per decode step of a sequence: `propose(seq_id, token_ids, room)`; after its verification:
    `record(seq_id, num_drafted, num_accepted)`; when it finishes or is aborted: `forget(seq_id)`
    (the state is small but lives until then). Preemption keeps the state: the tokens stay."""

    def __init__(
        self, config: SpeculativeConfig, adaptive: AdaptiveSettings | None = DEFAULT_ADAPTIVE
    ) -> None:
        self.config = config
        self.adaptive = adaptive  # None: propose whenever a match exists
        self._sequences: dict[Hashable, _SequenceDrafts] = {}

    def propose(self, seq_id: Hashable, token_ids: list[int], room: int) -> list[int]:
        """Draft token ids for the step after `token_ids` (prompt + output so far, a list that
        only grows), at most min(num_speculative_tokens, room) of them (`draft_room`); [] when
        nothing matches or the sequence's gate is off. Calling it again for the same tokens
        (a step that did not get scheduled) returns the same draft and changes nothing."""
        state = self._sequences.get(seq_id)
        if state is None:
            state = self._sequences[seq_id] = _SequenceDrafts(self.config, self.adaptive)
        k = min(self.config.num_speculative_tokens, room)
        state.index.sync(token_ids)
        gate = state.gate
        if gate is not None and not gate.on:
            if state.shadow:
                state.score_shadow(token_ids)
            if not gate.on:
                if not state.shadow and k > 0:
                    state.shadow = state.index.lookup(token_ids, k)
                    state.shadow_at = len(token_ids)
                return []
            state.shadow = []
        return state.index.lookup(token_ids, k) if k > 0 else []

    def record(self, seq_id: Hashable, num_drafted: int, num_accepted: int) -> None:
        """The outcome of verifying the drafts of `seq_id` (num_drafted as verified, after any
        trimming by the scheduler)."""
        state = self._sequences.get(seq_id)
        if state is not None and state.gate is not None:
            state.gate.record(num_drafted, num_accepted)

    def is_drafting(self, seq_id: Hashable) -> bool:
        """False while the sequence's gate is off (unknown sequences draft)."""
        state = self._sequences.get(seq_id)
        return state is None or state.gate is None or state.gate.on

    def forget(self, seq_id: Hashable) -> None:
        self._sequences.pop(seq_id, None)

    def __len__(self) -> int:
        """Sequences with state (for leak checks)."""
        return len(self._sequences)

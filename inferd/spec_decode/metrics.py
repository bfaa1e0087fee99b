"""Speculative decoding counters, with vLLM's metric names.

vLLM exports `spec_decode_num_drafts` (verifications that had at least one draft),
`spec_decode_num_draft_tokens`, `spec_decode_num_accepted_tokens` and
`spec_decode_num_accepted_tokens_per_pos` (a counter per draft position, labelled `position`).
These are plain monotonically growing counts, so a Prometheus exporter reads them as counters
(under the `inferd:` prefix like the others). Derived: the acceptance rate (accepted / drafted
tokens) and vLLM's mean acceptance length, 1 + accepted / drafts: the tokens a verification step
emits on average, the bonus or replacement token included.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodeMetrics:
    num_speculative_tokens: int  # k: the number of per-position counters
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.num_speculative_tokens < 1:
            raise ValueError(
                f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}"
            )
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.num_speculative_tokens

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        """One sequence's verification: `num_draft_tokens` drafts checked, the first
        `num_accepted` accepted (so positions 0 .. num_accepted - 1 each count one)."""
        if not 0 <= num_accepted <= num_draft_tokens <= self.num_speculative_tokens:
            raise ValueError(
                f"need 0 <= num_accepted ({num_accepted}) <= num_draft_tokens "
                f"({num_draft_tokens}) <= {self.num_speculative_tokens}"
            )
        if num_draft_tokens == 0:
            return  # a plain decode step: vLLM counts no draft
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        for pos in range(num_accepted):
            self.num_accepted_tokens_per_pos[pos] += 1

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens; None before any draft."""
        if self.num_draft_tokens == 0:
            return None
        return self.num_accepted_tokens / self.num_draft_tokens

    @property
    def mean_acceptance_length(self) -> float | None:
        """vLLM's: 1 + accepted / drafts, the tokens per verification step; None before any."""
        if self.num_drafts == 0:
            return None
        return 1.0 + self.num_accepted_tokens / self.num_drafts

    @property
    def acceptance_rate_per_pos(self) -> list[float | None]:
        """Per position j: the share of drafts whose j-th token was accepted."""
        if self.num_drafts == 0:
            return [None] * self.num_speculative_tokens
        return [n / self.num_drafts for n in self.num_accepted_tokens_per_pos]

    def merge(self, other: SpecDecodeMetrics) -> None:
        """Add another engine's (or step's) counts into these."""
        if other.num_speculative_tokens != self.num_speculative_tokens:
            raise ValueError("cannot merge metrics of different num_speculative_tokens")
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        for pos, n in enumerate(other.num_accepted_tokens_per_pos):
            self.num_accepted_tokens_per_pos[pos] += n

    def counters(self) -> dict[str, int | list[int]]:
        """The counters under vLLM's names (without a prefix)."""
        return {
            "spec_decode_num_drafts": self.num_drafts,
            "spec_decode_num_draft_tokens": self.num_draft_tokens,
            "spec_decode_num_accepted_tokens": self.num_accepted_tokens,
            "spec_decode_num_accepted_tokens_per_pos": list(self.num_accepted_tokens_per_pos),
        }

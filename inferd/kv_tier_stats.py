"""What a KV tier did since start, as plain data (it rides on EngineStats to the front end's
/metrics and dashboard; `plus` adds the counts of data-parallel replicas)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class TierStats:
    name: str  # "memory" or "disk"
    hits: int = 0  # blocks found and served
    misses: int = 0  # blocks looked for and not there
    bytes_written: int = 0
    bytes_read: int = 0
    load_seconds: float = 0.0  # reading and checking blocks (a thread: off the step)
    write_errors: int = 0  # a full disk, a read-only folder: the block is simply not kept
    damaged: int = 0  # entries that failed a check: deleted, their blocks recomputed
    stored_bytes: int = 0  # the folder's size as last measured (shared: replicas agree)
    capacity_bytes: int = 0

    def plus(self, other: TierStats) -> TierStats:
        summed = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)
                  if f.name not in ("name", "stored_bytes", "capacity_bytes")}  # fmt: skip
        # The folder is one for every replica: its size and bound are not added up.
        return replace(self, **summed, stored_bytes=max(self.stored_bytes, other.stored_bytes))


def merge_tiers(groups: list[tuple[TierStats, ...]]) -> tuple[TierStats, ...]:
    """Per tier name, the sum over replicas (in the first replica's order)."""
    merged: dict[str, TierStats] = {}
    for tiers in groups:
        for tier in tiers:
            merged[tier.name] = merged[tier.name].plus(tier) if tier.name in merged else tier
    return tuple(merged.values())

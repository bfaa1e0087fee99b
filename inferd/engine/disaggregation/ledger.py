"""What moved between the engines of a disaggregated server, per engine, for /metrics
(EngineStats' kv_transfer* fields) and the dashboard.

    prefill engine   a hand-over: its request finished its prompt and the prompt's last handed
                     block is in the transfer tier; seconds: the wait for that write (what the
                     request waits between its prompt and the decode engine); bytes: what its
                     connector wrote to the transfer tier
    decode engine    an arrival: the request's first output says how many prompt tokens came
                     from the pool or a tier (`num_cached_tokens`); the handed blocks beyond
                     those were recomputed (a block late past the connector's LOAD_WAIT_S,
                     evicted, damaged, or a prefill engine that died first); bytes and seconds:
                     what its connector read from the transfer tier

The bytes and the decode side's seconds are the transfer tier's own counters (TierStats of the
"memory" tier, kv_tier_stats.py): every block a prefill engine writes is for a hand-over, and
every block a decode engine reads is one arriving.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from inferd.engine_client import EngineStats

TRANSFER_TIER = "memory"  # the tier the engines hand blocks through (/dev/shm)


@dataclass
class EngineTransfers:
    transfers: int = 0
    seconds: float = 0.0  # a prefill engine's waits for its blocks' writes
    blocks_recomputed: int = 0


class TransferLedger:
    def __init__(self, roles: list[str]):
        self.roles = roles
        self.engines = [EngineTransfers() for _ in roles]

    def handed_over(self, prefill: int, write_wait_seconds: float) -> None:
        e = self.engines[prefill]
        e.transfers += 1
        e.seconds += write_wait_seconds

    def arrived(self, decode: int, handed_blocks: int, cached_tokens: int,
                block_size: int) -> int:  # fmt: skip
        """A handed request's first news from its decode engine; returns the handed blocks it
        recomputed."""
        recomputed = max(0, handed_blocks - cached_tokens // block_size)
        e = self.engines[decode]
        e.transfers += 1
        e.blocks_recomputed += recomputed
        return recomputed

    def annotate(self, index: int, stats: EngineStats) -> EngineStats:
        """An engine's stats with its role and transfers."""
        role, e = self.roles[index], self.engines[index]
        tier = next((t for t in stats.kv_tiers if t.name == TRANSFER_TIER), None)
        moved = 0 if tier is None else tier.bytes_written if role == "prefill" else tier.bytes_read
        seconds = e.seconds
        if role == "decode" and tier is not None:
            seconds = tier.load_seconds
        return replace(stats, engine_role=role, kv_transfers=e.transfers, kv_transfer_bytes=moved,
                       kv_transfer_seconds=seconds,
                       kv_transfer_blocks_recomputed=e.blocks_recomputed)  # fmt: skip

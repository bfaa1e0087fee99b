"""The KV tiers' series (`--kv-offload-memory`, `--kv-offload-dir`): per tier, with a `tier`
label ("memory", "disk"), what the tier did since start; and the KV connector's block counts.

    inferd:kv_tier_{hits,misses,bytes_written,bytes_read,load_seconds,write_errors,damaged}_total
    inferd:kv_tier_stored_bytes, inferd:kv_tier_capacity_bytes                  (gauges)
    inferd:kv_{blocks_saved,blocks_loaded,saves_dropped,lookups_late}_total

NOTE: registered on the server's registry only when the first stats that hold tiers arrive, so
a server without tiers exports none of these names, not even their HELP lines. With the engine
core in its own process that is after its first step (the core sends stats with its steps).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

# TierStats field (inferd/kv_tier_stats.py) → (name without the prefix and the
# _total suffix, HELP)
_TIER_COUNTERS = {
    "hits": ("kv_tier_hits", "KV blocks found in the tier and loaded."),
    "misses": ("kv_tier_misses", "KV blocks looked up in the tier and not found."),
    "bytes_written": ("kv_tier_bytes_written", "Bytes of KV blocks written to the tier."),
    "bytes_read": ("kv_tier_bytes_read", "Bytes of KV blocks read from the tier."),
    "load_seconds": ("kv_tier_load_seconds",
                     "Seconds spent reading and checking blocks from the tier (off the step)."),
    "write_errors": ("kv_tier_write_errors",
                     "KV blocks the tier failed to keep (a full disk, a read-only folder)."),
    "damaged": ("kv_tier_damaged",
                "Tier entries that failed a check: deleted, their blocks recomputed."),
}  # fmt: skip
_TIER_GAUGES = {
    "stored_bytes": ("kv_tier_stored_bytes", "Bytes the tier holds (as last measured)."),
    "capacity_bytes": ("kv_tier_capacity_bytes", "The tier's bound in bytes."),
}
# EngineStats field → (name without the prefix and the _total suffix, HELP)
_CONNECTOR_COUNTERS = {
    "kv_blocks_saved": ("kv_blocks_saved", "KV blocks copied out of the pool for the tiers."),
    "kv_blocks_loaded": ("kv_blocks_loaded", "KV blocks that entered the pool from a tier."),
    "kv_saves_dropped": ("kv_saves_dropped",
                         "KV blocks copied out faster than the tiers took them: not kept."),
    "kv_lookups_late": ("kv_lookups_late",
                        "Tier lookups unfinished when the prompt's wait ended: the rest "
                        "recomputed."),
}  # fmt: skip

# ServerMetrics._advance: (counter child, key of the last value seen, cumulative value)
Advance = Callable[[object, tuple[str, str], float], None]


class KVTierMetrics:
    def __init__(self, prefix: str, registry: CollectorRegistry, per_engine: list[str]):
        per_tier = [*per_engine, "tier"]
        self.tier_counters = {
            field: Counter(prefix + name, doc, per_tier, registry=registry)
            for field, (name, doc) in _TIER_COUNTERS.items()
        }
        self.tier_gauges = {
            field: Gauge(prefix + name, doc, per_tier, registry=registry)
            for field, (name, doc) in _TIER_GAUGES.items()
        }
        self.counters = {
            field: Counter(prefix + name, doc, per_engine, registry=registry)
            for field, (name, doc) in _CONNECTOR_COUNTERS.items()
        }

    def update(self, labels: dict[str, str], stats, advance: Advance) -> None:
        """One engine's stats (`labels`: its model_name and engine)."""
        engine = labels["engine"]
        for tier in stats.kv_tiers:
            for field, counter in self.tier_counters.items():
                advance(counter.labels(**labels, tier=tier.name),
                        (engine, f"kv_tier:{tier.name}:{field}"), getattr(tier, field))  # fmt: skip
            for field, gauge in self.tier_gauges.items():
                gauge.labels(**labels, tier=tier.name).set(getattr(tier, field))
        for field, counter in self.counters.items():
            advance(counter.labels(**labels), (engine, field), getattr(stats, field))

"""Disaggregated serving's series (`inferd serve --disaggregate`, engine/disaggregation/): each
engine's role, and what moved through the transfer tier, per engine (the `engine` label).

    inferd:engine_role{engine, role}                   1 (role: prefill or decode)
    inferd:kv_transfers_total                          requests handed on (prefill engine) or
                                                       received (decode engine)
    inferd:kv_transfer_bytes_total                     bytes written (prefill) or read (decode)
    inferd:kv_transfer_seconds_total                   waits for a prefill engine's block
                                                       writes, a decode engine's block reads
    inferd:kv_transfer_blocks_recomputed_total         handed blocks a decode engine recomputed
                                                       (late, lost or damaged)

Each engine's queue is inferd:num_requests_waiting{engine} already. NOTE: registered only once
stats carry a role, so a colocated server exports none of these names.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

# EngineStats field → (name without the prefix and the _total suffix, HELP)
_COUNTERS = {
    "kv_transfers": ("kv_transfers", "Requests whose KV this engine handed on (a prefill "
                     "engine) or received (a decode engine)."),
    "kv_transfer_bytes": ("kv_transfer_bytes", "Bytes of handed KV blocks written to the "
                          "transfer tier (a prefill engine) or read from it (a decode engine)."),
    "kv_transfer_seconds": ("kv_transfer_seconds", "Seconds moving handed KV: the waits for "
                            "a prefill engine's writes, a decode engine's reads (off its steps)."),
    "kv_transfer_blocks_recomputed": ("kv_transfer_blocks_recomputed", "Handed KV blocks a "
                                      "decode engine recomputed (late, lost or damaged)."),
}  # fmt: skip

Advance = Callable[[object, tuple[str, str], float], None]


class DisaggregationMetrics:
    def __init__(self, prefix: str, registry: CollectorRegistry, per_engine: list[str]):
        self.role = Gauge(prefix + "engine_role", "1 for the engine's role in disaggregated "
                          "serving (prefill or decode).", [*per_engine, "role"],
                          registry=registry)  # fmt: skip
        self.counters = {
            field: Counter(prefix + name, doc, per_engine, registry=registry)
            for field, (name, doc) in _COUNTERS.items()
        }

    def update(self, labels: dict[str, str], stats, advance: Advance) -> None:
        """One engine's stats (`labels`: its model_name and engine)."""
        self.role.labels(**labels, role=stats.engine_role).set(1)
        for field, counter in self.counters.items():
            advance(counter.labels(**labels), (labels["engine"], field), getattr(stats, field))

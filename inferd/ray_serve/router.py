"""`BlockPrefixRouter`: Serve's request-router interface over inferd's KV block hashes
(prefix_table.py), exact to the token: a request goes to the replica that holds the most of its
prompt's leading blocks, unless that replica is much busier than the least loaded one; prompts
no replica holds go to the less loaded of two random replicas (power of two choices).

Serve creates the router inside the caller's deployment handle (in the ingress process) and
calls `choose_replicas` for each request, with the handle call's arguments: the `EngineCall`
(wire.py). Serve then probes the first rank's queue lengths and sends the request to the least
loaded replica there that accepts it (`max_ongoing_requests`), else tries the next rank.
"""

from __future__ import annotations

import logging
import random
from collections import OrderedDict
from typing import Any

from ray.serve.request_router import (
    LocalityMixin,
    MultiplexMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from inferd.ray_serve.prefix_table import (
    NO_MATCH,
    OVERLOADED,
    PREFIX_HIT,
    BlockTable,
    prompt_block_hashes,
    rank,
)
from inferd.ray_serve.wire import EngineCall

log = logging.getLogger(__name__)

# Blocks a replica is assumed to hold until it reports its KV pool (`record_routing_stats`).
DEFAULT_TABLE_BLOCKS = 1 << 16
# Plans of requests being routed; a request cancelled while it waits for a replica leaves its
# plan behind, so the oldest go beyond this many.
_MAX_PLANS = 4096


def _call_of(pending: PendingRequest | None) -> EngineCall | None:
    if pending is None or not pending.args:
        return None
    call = pending.args[0]
    return call if isinstance(call, EngineCall) else None


class BlockPrefixRouter(LocalityMixin, MultiplexMixin, RequestRouter):
    # NOTE: no FIFOMixin: with it, a replica chosen for one request may serve another, which
    # would undo the prefix match.

    def initialize_state(self, block_size: int = 16, imbalance: int = 8, seed: int | None = None,
                         **kwargs: Any) -> None:  # fmt: skip
        if kwargs:
            raise ValueError(f"BlockPrefixRouter: unknown settings {sorted(kwargs)}")
        if block_size < 1 or imbalance < 0:
            raise ValueError("BlockPrefixRouter: block_size must be >= 1 and imbalance >= 0")
        self.block_size = block_size
        self.imbalance = imbalance
        self._rng = random.Random(seed)
        self._tables: dict[ReplicaID, BlockTable] = {}
        # request id → (its block hashes, the replicas holding its longest prefix, decision)
        self._plans: OrderedDict[str, tuple[list[bytes], list[ReplicaID], str]] = OrderedDict()

    def _table(self, replica: RunningReplica) -> BlockTable:
        table = self._tables.get(replica.replica_id)
        blocks = (replica.routing_stats or {}).get("num_kv_blocks") or DEFAULT_TABLE_BLOCKS
        if table is None:
            table = self._tables[replica.replica_id] = BlockTable(blocks)
        table.capacity = blocks
        return table

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        call = _call_of(pending_request)
        if call is None or not candidate_replicas:
            return [candidate_replicas]
        try:
            return self._choose(call, candidate_replicas)
        except Exception:  # noqa: BLE001 - a routing bug must not strand the request
            log.exception("BlockPrefixRouter failed; routing request %s to any replica",
                          call.request_id)  # fmt: skip
            return [candidate_replicas]

    def _choose(self, call: EngineCall, candidate_replicas: list[RunningReplica]
                ) -> list[list[RunningReplica]]:  # fmt: skip
        plan = self._plans.get(call.request_id)
        hashes = plan[0] if plan else prompt_block_hashes(call.token_ids or (), self.block_size,
                                                          call.cache_salt)  # fmt: skip
        by_id = {r.replica_id: r for r in candidate_replicas}
        matches = {rid: self._table(r).match(hashes) for rid, r in by_id.items()}
        cache = self.replica_queue_len_cache
        loads = {rid: cache.get(rid) or 0 for rid in by_id}
        ranks, decision = rank(matches, loads, self.imbalance, self._rng)
        holders = ranks[0] if decision == PREFIX_HIT else []
        self._plans[call.request_id] = (hashes, holders, decision)
        if len(self._plans) > _MAX_PLANS:
            self._plans.popitem(last=False)
        return [[by_id[rid] for rid in r] for r in ranks]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:  # fmt: skip
        call = _call_of(pending_request)
        if call is None:
            return
        hashes, holders, decision = self._plans.pop(call.request_id, ([], [], NO_MATCH))
        if decision == PREFIX_HIT and replica_id not in holders:
            decision = OVERLOADED  # every holder refused it (at max_ongoing_requests)
        call.decision = decision
        table = self._tables.get(replica_id)
        if table is not None:
            table.insert(hashes)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._tables.pop(replica_id, None)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id for r in replicas}
        for gone in set(self._tables) - live:
            del self._tables[gone]

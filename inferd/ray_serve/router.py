"""`BlockPrefixRouter`: Serve's request-router interface over inferd's KV block hashes
(prefix_table.py), exact to the token: a request goes to the replica that holds the most of its
prompt's leading blocks, unless that replica is much busier than the least loaded one; prompts
no replica holds go to the least loaded replica. Load is the router's own count of the requests
it has on each replica or is sending there (exact with one ingress, and current within a burst,
where Serve's queue-length cache lags), or Serve's count when that is higher. With a single
replica there is nothing to choose and no prompt is hashed.

Serve creates the router inside the caller's deployment handle (in the ingress process) and
calls `choose_replicas` for each request, with the handle call's arguments: the `EngineCall`
(wire.py). Serve then probes the first rank's queue lengths and sends the request to the least
loaded replica there that accepts it (`max_ongoing_requests`), else tries the next rank.
"""

from __future__ import annotations

import logging
import random
from collections import OrderedDict
from dataclasses import dataclass
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
    ONLY_REPLICA,
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


@dataclass
class _Plan:
    """A request being routed: its prompt's hashes and where the router wants it."""

    hashes: list[bytes]
    holders: list[ReplicaID]  # the replicas holding its longest prefix (a prefix hit)
    decision: str
    first: ReplicaID  # the replica Serve tries first: it counts as that replica's load already
    pending: PendingRequest


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
        # Requests this router has in flight on each replica (by Serve's internal request id):
        # exact and current, where Serve's queue-length cache lags behind bursts.
        self._inflight: dict[ReplicaID, set[str]] = {}
        # Requests chosen for but not yet on a replica, by request id.
        self._plans: OrderedDict[str, _Plan] = OrderedDict()

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
            return self._choose(call, candidate_replicas, pending_request)
        except Exception:  # noqa: BLE001 - a routing bug must not strand the request
            log.exception("BlockPrefixRouter failed; routing request %s to any replica",
                          call.request_id)  # fmt: skip
            return [candidate_replicas]

    def _choose(self, call: EngineCall, candidate_replicas: list[RunningReplica],
                pending: PendingRequest) -> list[list[RunningReplica]]:  # fmt: skip
        plan = self._plans.pop(call.request_id, None)
        if len(candidate_replicas) == 1:
            # NOTE: nothing to choose, so nothing is hashed (a sha256 pass over the prompt, on
            # the ingress's event loop), and the replica's table is not filled: a replica
            # added later starts even with it.
            only = candidate_replicas[0].replica_id
            self._plan(call.request_id, _Plan([], [], ONLY_REPLICA, only, pending))
            return [candidate_replicas]
        # NOTE: no adapter in the names: replicas on Ray serve no LoRA adapters (`inferd serve
        # --ray --enable-lora` is refused). When they do, the call's adapter joins the names as
        # in the engine's cache (block_hashes.prompt_root).
        hashes = (
            plan.hashes
            if plan and plan.decision != ONLY_REPLICA
            else prompt_block_hashes(call.token_ids or (), self.block_size, call.cache_salt)
        )
        by_id = {r.replica_id: r for r in candidate_replicas}
        matches = {rid: self._table(r).match(hashes) for rid, r in by_id.items()}
        ranks, decision = rank(matches, self._loads(by_id), self.imbalance, self._rng)
        holders = ranks[0] if decision == PREFIX_HIT else []
        self._plan(call.request_id, _Plan(hashes, holders, decision, ranks[0][0], pending))
        return [[by_id[rid] for rid in r] for r in ranks]

    def _plan(self, request_id: str, plan: _Plan) -> None:
        self._plans[request_id] = plan
        if len(self._plans) > _MAX_PLANS:
            self._plans.popitem(last=False)

    def _loads(self, replicas) -> dict[ReplicaID, int]:
        """Requests on each replica or on their way there. NOTE: a burst of requests is chosen
        for before the first of them is on a replica, so those planned count too."""
        cache = self.replica_queue_len_cache
        planned: dict[ReplicaID, int] = {}
        for p in self._plans.values():
            if not p.pending.future.cancelled():
                planned[p.first] = planned.get(p.first, 0) + 1
        return {rid: max(len(self._inflight.get(rid, ())) + planned.get(rid, 0),
                         cache.get(rid) or 0) for rid in replicas}  # fmt: skip

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:  # fmt: skip
        call = _call_of(pending_request)
        if call is None:
            return
        plan = self._plans.pop(call.request_id, None)
        decision = plan.decision if plan else NO_MATCH
        if decision == PREFIX_HIT and replica_id not in plan.holders:
            decision = OVERLOADED  # every holder refused it (at max_ongoing_requests)
        call.decision = decision
        self._inflight.setdefault(replica_id, set()).add(
            pending_request.metadata.internal_request_id
        )
        table = self._tables.get(replica_id)
        if table is not None and plan is not None:
            table.insert(plan.hashes)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self._inflight.get(replica_id, set()).discard(internal_request_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._tables.pop(replica_id, None)
        self._inflight.pop(replica_id, None)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id for r in replicas}
        for gone in set(self._tables) - live:
            del self._tables[gone]
        for gone in set(self._inflight) - live:
            del self._inflight[gone]

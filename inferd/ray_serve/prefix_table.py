"""Prefix affinity on inferd's own KV block hashes: which replica most likely holds a prompt's
leading blocks in its prefix cache, and the routing choice that follows. Pure Python, no Ray:
`router.py` adapts it to Serve's request-router interface.

A replica's engine caches full KV blocks under chained hashes
(inferd/engine/scheduling/request.py): block i's hash covers tokens [0, (i+1) * block_size), so two
prompts share cached blocks exactly as far as their hash lists agree. The router keeps, per
replica, the hashes of the prompts it sent there (LRU-bounded by that replica's KV pool), and a
prompt's match with a replica is the number of its leading hashes found there: tokens the replica
need not compute again.

The hashes are the engine's own definition (inferd/block_hashes.py), under a root of the
router's (the engine's is its model identity; equal on every replica, so matches are the same).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Hashable, Sequence

from inferd.block_hashes import prompt_block_hashes as chained_block_hashes

ROOT = b"inferd-router"


def prompt_block_hashes(token_ids: Sequence[int], block_size: int,
                        cache_salt: str | None = None) -> list[bytes]:  # fmt: skip
    """The chained hashes of the prompt's full blocks, under the router's root."""
    return chained_block_hashes(token_ids, block_size, ROOT, cache_salt)


class BlockTable:
    """The block hashes one replica most likely holds, least recently routed first out."""

    def __init__(self, capacity: int):
        self.capacity = max(1, capacity)
        self._hashes: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._hashes)

    def match(self, hashes: Sequence[bytes]) -> int:
        """How many leading blocks of the prompt this replica holds."""
        n = 0
        for h in hashes:
            if h not in self._hashes:
                break
            n += 1
        return n

    def insert(self, hashes: Sequence[bytes]) -> None:
        for h in hashes:
            self._hashes[h] = None
            self._hashes.move_to_end(h)
        while len(self._hashes) > self.capacity:
            self._hashes.popitem(last=False)


# Routing decisions, as counted in the ingress's /metrics (inferd:router_decisions_total).
PREFIX_HIT = "prefix_hit"  # sent to the replica holding the longest prefix
NO_MATCH = "no_prefix_match"  # no replica holds a block of it: the least loaded
OVERLOADED = "prefix_replica_busy"  # the best match is too busy: the least loaded
ONLY_REPLICA = "only_replica"  # one replica to send it to: nothing chosen, nothing hashed


def rank(
    matches: dict[Hashable, int],
    loads: dict[Hashable, int],
    imbalance: int,
    rng: random.Random,
) -> tuple[list[list[Hashable]], str]:
    """Serve's ranks (the first rank is tried first, the least loaded replica in it chosen) and
    the decision. A replica with the longest match wins unless it has more than `imbalance`
    requests beyond the least loaded replica; otherwise a least loaded replica (a random one of
    them, so that fresh prompts spread) comes first, then the others by load."""
    ids = list(matches)
    if not ids:
        return [], NO_MATCH
    best = max(matches.values())
    least = min(loads.get(i, 0) for i in ids)
    if best > 0:
        holders = [i for i in ids if matches[i] == best]
        if min(loads.get(i, 0) for i in holders) - least <= imbalance:
            rest = sorted((i for i in ids if matches[i] < best), key=lambda i: -matches[i])
            return [holders, rest] if rest else [holders], PREFIX_HIT
        decision = OVERLOADED
    else:
        decision = NO_MATCH
    # NOTE: one replica first, not all the least loaded: Serve would pick among a rank by its
    # own queue lengths, which lag behind a burst of requests arriving at once.
    first = rng.choice([i for i in ids if loads.get(i, 0) == least])
    rest = sorted((i for i in ids if i != first), key=lambda i: (loads.get(i, 0), rng.random()))
    return [[first], rest] if rest else [[first]], decision

"""Which data-parallel replica (engine core) gets a request.

    prefix        (default) the replica that holds the longest prefix of the prompt in its
                  prefix cache, unless its load exceeds the least loaded replica's by more than
                  `slack` requests; then, or when none holds any of it, the least loaded one
    round-robin   in turn
    least-loaded  the one with the fewest unfinished requests (the lowest index on ties)

"Holds" is judged the way the KV cache names blocks: by the chained sha256 of each full block of
the prompt under the request's cache_salt and LoRA adapter (inferd/block_hashes.py, the KV
cache's own definition), so a prefix the router saw go to a replica has the names that
replica's cache registered it under. The router remembers, per block name, the replica it last sent
it to, as many names as the replicas' pools hold blocks (least recently routed forgotten first), a
stand-in for what each cache still holds. Load is what the front end knows exactly: requests sent
to a replica and not yet finished. Dead replicas (None in `loads`) are never chosen; with one live
replica nothing is hashed.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict

from inferd.block_hashes import prompt_block_hashes
from inferd.lora_request import LoRARequest

POLICIES = ("prefix", "round-robin", "least-loaded")


class NoReplica(RuntimeError):
    """Every replica is dead."""


class Router:
    def __init__(self, policy: str, block_size: int, hash_root: bytes, capacity_blocks: int,
                 slack: int = 4):  # fmt: skip
        if policy not in POLICIES:
            raise ValueError(f"--data-parallel-routing must be one of {', '.join(POLICIES)}, "
                             f"got {policy!r}")  # fmt: skip
        self.policy, self.block_size, self.hash_root = policy, block_size, hash_root
        self.capacity, self.slack = max(1, capacity_blocks), slack
        self._owner: OrderedDict[bytes, int] = OrderedDict()  # block name → replica
        self._turn = itertools.count()

    def choose(self, prompt_token_ids: list[int], cache_salt: str | None,
               loads: list[int | None], lora: LoRARequest | None = None) -> int:  # fmt: skip
        """The replica for a request with this prompt, `cache_salt` and adapter."""
        live = [i for i, n in enumerate(loads) if n is not None]
        if not live:
            raise NoReplica("every engine core replica is dead")
        if len(live) == 1:
            # NOTE: nothing to choose, so nothing is hashed: hashing costs a sha256 pass over
            # the prompt, on the server's event loop.
            return live[0]
        least = min(live, key=lambda i: (loads[i], i))
        if self.policy == "least-loaded":
            return least
        if self.policy == "round-robin":
            turn = next(self._turn)
            return live[turn % len(live)]
        return self._by_prefix(prompt_token_ids, cache_salt, loads, live, least, lora)[0]

    def choose_holding(self, prompt_token_ids: list[int], cache_salt: str | None,
                       loads: list[int | None],
                       lora: LoRARequest | None = None) -> tuple[int, int]:  # fmt: skip
        """(the replica the prefix policy chooses, how many leading blocks of the prompt it
        holds), hashed even with one live replica: disaggregated serving
        (engine/disaggregation/) sends a prompt a decode engine holds whole past prefill."""
        live = [i for i, n in enumerate(loads) if n is not None]
        if not live:
            raise NoReplica("every engine core replica is dead")
        least = min(live, key=lambda i: (loads[i], i))
        return self._by_prefix(prompt_token_ids, cache_salt, loads, live, least, lora)

    def _by_prefix(self, prompt_token_ids: list[int], cache_salt: str | None,
                   loads: list[int | None], live: list[int], least: int,
                   lora: LoRARequest | None) -> tuple[int, int]:  # fmt: skip
        hashes = self.block_names(prompt_token_ids, cache_salt, lora)
        best, held = self._longest_holder(hashes, set(live))
        chosen, kept = least, 0
        if best is not None and held and loads[best] - loads[least] <= self.slack:
            chosen, kept = best, held
        self._remember(hashes, chosen)
        return chosen, kept

    def forget(self) -> None:
        """The replicas' prefix caches were emptied (a sleep): no replica holds any block."""
        self._owner.clear()

    def block_names(self, token_ids: list[int], cache_salt: str | None,
                    lora: LoRARequest | None = None) -> list[bytes]:  # fmt: skip
        """The chained names of the prompt's full blocks, as the replicas' caches compute them
        (salt and adapter included: an adapter's blocks are its own)."""
        return prompt_block_hashes(token_ids, self.block_size, self.hash_root, cache_salt, lora)

    def _longest_holder(self, hashes: list[bytes], live: set[int]) -> tuple[int | None, int]:
        """(the replica holding the longest leading run of these blocks, its length)."""
        if not hashes:
            return None, 0
        first = self._owner.get(hashes[0])
        if first is None or first not in live:
            return None, 0
        held = 1
        while held < len(hashes) and self._owner.get(hashes[held]) == first:
            held += 1
        return first, held

    def _remember(self, hashes: list[bytes], replica: int) -> None:
        for h in hashes:
            self._owner[h] = replica
            self._owner.move_to_end(h)
        while len(self._owner) > self.capacity:
            self._owner.popitem(last=False)

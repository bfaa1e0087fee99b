"""inferd's request router as Serve drives it, over fake replicas and requests (no cluster): a
burst of fresh prompts spreads even before any of them reaches a replica, a follow-up goes to
the replica holding its blocks, and not when that one is too busy; each decision lands on the
request for the ingress to count."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

pytest.importorskip("ray.serve")

from inferd.ray_serve import router as router_module  # noqa: E402
from inferd.ray_serve.prefix_table import (  # noqa: E402
    NO_MATCH,
    ONLY_REPLICA,
    OVERLOADED,
    PREFIX_HIT,
)
from inferd.ray_serve.router import BlockPrefixRouter  # noqa: E402
from inferd.ray_serve.wire import EngineCall  # noqa: E402
from inferd.sampling_params import SamplingParams  # noqa: E402


class FakeReplica:
    def __init__(self, name: str):
        self.replica_id, self.routing_stats = name, {"num_kv_blocks": 1000}


class FakePending:
    def __init__(self, request_id: str, ids: list[int]):
        prompt = {"prompt": None, "prompt_token_ids": ids}
        self.args = [EngineCall(request_id, prompt, SamplingParams(), 0.0)]
        self.metadata = type("Metadata", (), {"internal_request_id": "internal-" + request_id})
        self.future = asyncio.get_running_loop().create_future()

    @property
    def decision(self) -> str | None:
        return self.args[0].decision


def _router() -> BlockPrefixRouter:
    router = object.__new__(BlockPrefixRouter)  # Serve's constructor wants a live deployment
    router._replica_queue_len_cache = {}  # Serve's queue lengths: none known yet
    router.initialize_state(block_size=16, imbalance=1, seed=3)
    return router


async def _first(router, replicas, pending) -> str:
    return (await router.choose_replicas(replicas, pending))[0][0].replica_id


def test_a_burst_spreads_and_follow_ups_go_where_their_blocks_are():
    async def main():
        router, replicas = _router(), [FakeReplica("a"), FakeReplica("b")]
        burst = [FakePending(f"r{i}", [i] * 48) for i in range(4)]
        firsts = [await _first(router, replicas, p) for p in burst]  # none routed yet
        assert sorted(firsts) == ["a", "a", "b", "b"]
        for p, replica in zip(burst, firsts, strict=True):
            router.on_request_routed(p, replica, None)
            assert p.decision == NO_MATCH
        holder = firsts[2]
        follow = FakePending("r9", [2] * 48 + [7] * 16)  # r2's prompt and one block more
        assert await _first(router, replicas, follow) == holder
        router.on_request_routed(follow, holder, None)
        assert follow.decision == PREFIX_HIT

    asyncio.run(main())


def test_a_busy_holder_is_passed_over_and_a_finished_request_frees_it():
    async def main():
        router, replicas = _router(), [FakeReplica("a"), FakeReplica("b")]
        first = FakePending("r0", [5] * 48)
        holder = await _first(router, replicas, first)
        router.on_request_routed(first, holder, None)
        other = "b" if holder == "a" else "a"
        busy = [FakePending(f"busy{i}", [100 + i] * 16) for i in range(2)]
        for p in busy:  # two more on the holder: two beyond the other, over the imbalance
            router.on_request_routed(p, holder, None)
        again = FakePending("r1", [5] * 48)
        assert await _first(router, replicas, again) == other
        router.on_request_routed(again, other, None)
        assert again.decision == OVERLOADED
        for p in [first, *busy]:
            router.on_request_completed(holder, p.metadata.internal_request_id)
        router.on_request_completed(other, again.metadata.internal_request_id)
        third = FakePending("r2", [5] * 48)  # both hold it now; either is a prefix hit
        assert await _first(router, replicas, third) in (holder, other)
        router.on_request_routed(third, holder, None)
        assert third.decision == PREFIX_HIT

    asyncio.run(main())


def test_a_single_replica_is_chosen_without_hashing_the_prompt(monkeypatch):
    def no_hashing(*args):
        raise AssertionError("the prompt was hashed")

    async def main():
        router, only = _router(), [FakeReplica("a")]
        pending = FakePending("r0", [5] * 48)
        assert await router.choose_replicas(only, pending) == [only]
        router.on_request_routed(pending, "a", None)
        assert pending.decision == ONLY_REPLICA
        with pytest.raises(AssertionError, match="hashed"):  # two replicas: it hashes
            router._choose(pending.args[0], [*only, FakeReplica("b")], pending)

    monkeypatch.setattr(hashlib, "sha256", no_hashing)
    monkeypatch.setattr(router_module, "prompt_block_hashes", no_hashing)
    asyncio.run(main())

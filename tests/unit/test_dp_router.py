"""Routing requests over data-parallel replicas (engine/frontend/dp_router.py): the block names it
hashes are those the KV cache registers (cache_salt and LoRA adapter included), prefix affinity
with a load bound, round-robin and least-loaded, dead replicas never chosen, a lone live replica
chosen without hashing the prompt; and the replicas' stats merged for /metrics."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools

import pytest

from inferd.config import EngineConfig
from inferd.engine.frontend import dp_router
from inferd.engine.frontend.async_core_client import replica_configs, replica_gpus
from inferd.engine.frontend.dp_router import NoReplica, Router
from inferd.engine.frontend.replica_stats import merge_stats
from inferd.engine.scheduling.request import Request, Sequence, update_block_hashes
from inferd.engine_client import EngineStats
from inferd.lora_request import LoRARequest
from inferd.outputs import RequestMetrics
from inferd.sampling_params import SamplingParams

ROOT = b"model-identity"
BS = 4
ADAPTER = LoRARequest("sql", 1, "/adapters/sql")


def router(policy="prefix", slack=2, capacity=1000) -> Router:
    return Router(policy, BS, ROOT, capacity, slack)


def test_block_names_are_the_kv_caches_hashes():
    prompt = list(range(30, 49))  # 4 full blocks and 3 tokens
    for salt, lora in itertools.product((None, "tenant"), (None, ADAPTER)):
        req = Request("r", prompt, SamplingParams(), RequestMetrics(0.0), 4, cache_salt=salt,
                      lora=lora)  # fmt: skip
        seq = Sequence(0, req, 0, list(prompt), len(prompt))
        update_block_hashes(seq, BS, ROOT)
        assert router().block_names(prompt, salt, lora) == seq.block_hashes
    assert router().block_names(prompt, "a") != router().block_names(prompt, "b")
    assert router().block_names(prompt, None, ADAPTER) != router().block_names(prompt, None)


def test_an_adapter_request_goes_where_its_adapters_blocks_are():
    r, prompt = router(slack=2), list(range(200, 240))
    assert r.choose(prompt, None, [0, 1]) == 0  # the base model's blocks: on replica 0
    # Replica 0 holds nothing computed under the adapter: the least loaded replica gets it...
    assert r.choose(prompt, None, [1, 0], ADAPTER) == 1
    # ...and the adapter's next request goes there, the base model's to replica 0.
    assert r.choose(prompt + [1, 2, 3, 4], None, [0, 1], ADAPTER) == 1
    assert r.choose(prompt + [1, 2, 3, 4], None, [1, 0]) == 0
    other = LoRARequest("other", 2, "/adapters/other")
    assert r.choose(prompt, None, [0, 1], other) == 0  # another adapter holds none of them


def test_one_live_replica_is_chosen_without_hashing_the_prompt(monkeypatch):
    def no_hashing(*args):
        raise AssertionError("the prompt was hashed")

    monkeypatch.setattr(hashlib, "sha256", no_hashing)
    monkeypatch.setattr(dp_router, "prompt_block_hashes", no_hashing)
    prompt = list(range(64))
    for policy in dp_router.POLICIES:
        r = router(policy)
        assert r.choose(prompt, "tenant", [5], ADAPTER) == 0
        assert r.choose(prompt, None, [None, 3, None]) == 1  # the others dead
    with pytest.raises(AssertionError, match="hashed"):  # two live: the prefix policy hashes
        router().choose(prompt, None, [0, 0])


def test_prefix_routing_follows_the_prefix_until_the_load_bound():
    r = router(slack=2)
    history = list(range(100, 140))
    first = r.choose(history, None, [3, 0])  # nobody holds it: the least loaded
    assert first == 1
    # The next turn resends the history: it goes where the history is, though busier...
    assert r.choose(history + [7, 8, 9, 10], None, [0, 2]) == 1
    # ...unless that replica is more than `slack` requests busier than the least loaded.
    assert r.choose(history + [7, 8, 9, 10, 11], None, [0, 3]) == 0
    # A salted prompt shares nothing with the unsalted one.
    assert r.choose(history, "tenant", [1, 0]) == 1 and r.choose(history, "x", [0, 1]) == 0


def test_the_router_forgets_the_least_recently_routed_blocks_first():
    a, b = list(range(0, 16)), list(range(100, 116))  # 4 blocks each
    for capacity, expected in ((8, 0), (4, 1)):  # 8 names: both kept; 4: b's push a's out
        r = router(capacity=capacity)
        assert r.choose(a, None, [0, 0]) == 0
        assert r.choose(b, None, [1, 0]) == 1
        assert r.choose(a, None, [1, 0]) == expected  # affinity, or the least loaded


def test_round_robin_least_loaded_and_dead_replicas():
    rr = router("round-robin")
    assert [rr.choose([1], None, [0, 0, 0]) for _ in range(4)] == [0, 1, 2, 0]
    assert [rr.choose([1], None, [0, None, 0]) for _ in range(2)] == [0, 2]
    least = router("least-loaded")
    assert least.choose([1], None, [2, 1, 1]) == 1 and least.choose([1], None, [2, None, 3]) == 0
    prefix = router()
    held = list(range(50, 70))
    assert prefix.choose(held, None, [0, 1]) == 0
    assert prefix.choose(held, None, [None, 5]) == 1  # its holder died: routed around
    with pytest.raises(NoReplica):
        prefix.choose(held, None, [None, None])
    with pytest.raises(ValueError, match="--data-parallel-routing must be one of"):
        Router("random", BS, ROOT, 10)


def test_replicas_split_the_cores_and_refuse_oversubscription():
    config = EngineConfig()
    assert replica_configs(config, 1, cpu_count=2) == [config]
    two = replica_configs(config, 2, cpu_count=4)
    assert [c.num_threads for c in two] == [2, 2]
    with pytest.raises(ValueError, match="needs more than the 2 CPU cores"):
        replica_configs(dataclasses.replace(config, num_threads=2), 2, cpu_count=2)
    with pytest.raises(ValueError, match="needs more than the 2 CPU cores"):
        replica_configs(dataclasses.replace(config, tensor_parallel_size=2), 2, cpu_count=2)


def test_replicas_on_cuda_take_a_gpu_each_or_share_within_their_memory():
    config = EngineConfig(device="cuda", gpu_memory_utilization=0.45)
    two = replica_configs(config, 2, cpu_count=16, gpu_count=2)
    assert [c.device for c in two] == ["cuda:0", "cuda:1"]
    shared = replica_configs(config, 2, cpu_count=16, gpu_count=1)
    assert [c.device for c in shared] == ["cuda:0", "cuda:0"]
    assert replica_gpus(3, 2, 0.5) == [0, 1, 0]
    with pytest.raises(ValueError, match="puts 2 replicas on one GPU.*at most 0.50"):
        replica_configs(dataclasses.replace(config, gpu_memory_utilization=0.9), 2,
                        cpu_count=16, gpu_count=1)  # fmt: skip
    with pytest.raises(ValueError, match="no CUDA device is visible"):
        replica_gpus(2, 0, 0.4)


def test_merged_stats_add_up_every_field():
    a = EngineStats(1, 2, 0.25, 3, 40, 10, 100, 50, 7, None, 2, 8, 5, (3, 2), ("x",), {"x": 2})
    b = EngineStats(4, 0, 0.75, 1, 60, 30, 10, 5, 3, None, 1, 4, 1, (1,), ("y",),
                    {"x": 1, "y": 4})  # fmt: skip
    merged = merge_stats([a, b])
    expected = {f.name: getattr(a, f.name) + getattr(b, f.name)
                for f in dataclasses.fields(EngineStats)
                if f.name not in ("kv_cache_usage", "step_timing", "lora_resident", "lora_requests",
                                  "spec_decode_num_accepted_tokens_per_pos",
                                  "step_efficiency")}  # fmt: skip
    assert {k: getattr(merged, k) for k in expected} == expected
    assert merged.kv_cache_usage == 0.75 and merged.spec_decode_num_accepted_tokens_per_pos == (
        4,
        2,
    )
    assert merged.lora_resident == ("x", "y") and merged.lora_requests == {"x": 3, "y": 4}
    assert merge_stats([a]) is a


def test_metrics_carry_one_series_per_replica():
    from inferd.server.metrics.prometheus import ServerMetrics

    replicas = [
        EngineStats(1, 0, 0.5, 0, 0, 0, 10, 4, 2),
        EngineStats(2, 1, 0.25, 0, 0, 0, 3, 9, 5),
    ]
    metrics = ServerMetrics("m", replica_stats=lambda: replicas)
    text = metrics.render(merge_stats(replicas)).decode()
    for engine, stats in enumerate(replicas):
        labels = f'{{engine="{engine}",model_name="m"}}'
        assert f"inferd:generation_tokens_total{labels} {float(stats.generation_tokens)}" in text
        assert f"inferd:num_requests_running{labels} {float(stats.num_running)}" in text

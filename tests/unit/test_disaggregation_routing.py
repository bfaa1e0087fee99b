"""Disaggregated serving's decisions without engines (milliseconds): where a prompt is computed
(engine/disaggregation/routing.py), the decode engine's choice by the data-parallel router's
prefix affinity (dp_router.py `choose_holding`), the transfer accounting (ledger.py), the flags
refused, and the stats' merge across the process boundary."""

from __future__ import annotations

import argparse

import pytest

from inferd.config import EngineConfig
from inferd.engine.disaggregation.engine_roles import (
    DEFAULT_TRANSFER_MEMORY,
    check_disaggregation,
    engine_roles,
    transfer_config,
)
from inferd.engine.disaggregation.ledger import TransferLedger
from inferd.engine.disaggregation.routing import handed_blocks, route_prompt
from inferd.engine.frontend.dp_router import NoReplica, Router
from inferd.engine.frontend.replica_stats import merge_stats
from inferd.engine_client import EngineStats
from inferd.kv_tier_stats import TierStats

BS = 16


def test_handed_blocks_leave_the_last_prompt_token_to_the_decode_engine():
    assert [handed_blocks(n, BS) for n in (0, 1, 16, 17, 32, 33, 100)] == [0, 0, 0, 1, 1, 2, 6]


@pytest.mark.parametrize(
    ("prompt", "holds", "min_prompt", "loads", "needs", "expected"),
    [
        (300, 0, 256, [3, 1], False, (1, "prefill")),  # the least loaded prefill engine
        (300, 0, 256, [2, 2], False, (0, "prefill")),  # ties: the lowest index
        (300, 0, 256, [None, 5], False, (1, "prefill")),  # a dead one is never chosen
        (255, 0, 256, [0, 0], False, (None, "short")),
        (300, 18, 256, [0, 0], False, (None, "cached")),  # 299 // 16 = 18 blocks: all held
        (300, 17, 256, [0, 0], False, (0, "prefill")),  # one block short: prefilled
        (300, 0, 256, [None, None], False, (None, "no-prefill")),
        (300, 0, 256, [0, 0], True, (None, "needs-prompt")),
    ],
)
def test_route_prompt(prompt, holds, min_prompt, loads, needs, expected):
    route = route_prompt(prompt, BS, holds, min_prompt, loads, needs)
    assert (route.prefill, route.reason) == expected


def test_the_decode_engine_is_chosen_by_prefix_affinity_even_when_it_is_the_only_one():
    router = Router("prefix", BS, b"root", capacity_blocks=1000, slack=2)
    prompt = list(range(100))
    # engine 0 is a prefill engine (None: not a candidate), 1 the one decode engine
    assert router.choose_holding(prompt, None, [None, 0]) == (1, 0)
    assert router.choose_holding(prompt, None, [None, 0]) == (1, 6)  # 100 // 16 blocks held
    assert router.choose_holding(prompt[:40] + [7] * 60, None, [None, 3]) == (1, 2)
    # another salt names other blocks: nothing held
    assert router.choose_holding(prompt, "salt", [None, 0]) == (1, 0)
    with pytest.raises(NoReplica):
        router.choose_holding(prompt, None, [None, None])


def test_affinity_yields_to_the_load_bound():
    router = Router("prefix", BS, b"root", capacity_blocks=1000, slack=2)
    prompt = list(range(64))
    assert router.choose_holding(prompt, None, [None, 0, 0])[0] == 1
    assert router.choose_holding(prompt, None, [None, 2, 0]) == (1, 4)  # within the slack
    assert router.choose_holding(prompt, None, [None, 3, 0]) == (2, 0)  # too busy: least loaded
    # the plain choice is unchanged: one live replica, nothing hashed
    assert router.choose(prompt, None, [None, 7, None]) == 1


def _stats(tier: TierStats | None = None) -> EngineStats:
    return EngineStats(1, 2, 0.5, 0, 0, 0, 0, 0, 3, kv_tiers=(tier,) if tier else ())


def test_the_ledger_counts_hand_overs_arrivals_and_recomputed_blocks():
    ledger = TransferLedger(engine_roles(1, 2))
    ledger.handed_over(0, 0.25)
    ledger.handed_over(0, 0.5)
    assert ledger.arrived(1, handed_blocks=6, cached_tokens=96, block_size=BS) == 0
    assert ledger.arrived(2, handed_blocks=6, cached_tokens=40, block_size=BS) == 4  # 2 loaded
    written = TierStats("memory", bytes_written=4096, bytes_read=7, load_seconds=9.0)
    read = TierStats("memory", bytes_written=5, bytes_read=2048, load_seconds=0.125)
    prefill = ledger.annotate(0, _stats(written))
    decode = ledger.annotate(2, _stats(read))
    assert (prefill.engine_role, prefill.kv_transfers, prefill.kv_transfer_bytes) == (
        "prefill", 2, 4096)  # fmt: skip
    assert prefill.kv_transfer_seconds == pytest.approx(0.75)  # its waits for writes
    assert (decode.engine_role, decode.kv_transfers, decode.kv_transfer_bytes) == (
        "decode", 1, 2048)  # fmt: skip
    assert decode.kv_transfer_seconds == 0.125  # its reads
    assert decode.kv_transfer_blocks_recomputed == 4
    assert ledger.annotate(1, _stats()).kv_transfer_bytes == 0  # no tier stats yet
    merged = merge_stats([prefill, decode])
    assert merged.engine_role == "decode+prefill"
    assert (merged.kv_transfers, merged.kv_transfer_bytes) == (3, 4096 + 2048)
    assert merged.kv_transfer_blocks_recomputed == 4


def test_engine_flags_that_cannot_work_are_refused():
    config = EngineConfig(model="m")
    for kwargs, needle in [
        (dict(enable_prefix_caching=False), "prefix caching"),
        (dict(tensor_parallel_size=2), "tensor-parallel-size"),
        (dict(enable_lora=True), "enable-lora"),
    ]:
        with pytest.raises(ValueError, match=needle):
            check_disaggregation(EngineConfig(model="m", **kwargs), 1, 1, 0)
    with pytest.raises(ValueError, match="at least one prefill"):
        check_disaggregation(config, 0, 1, 0)
    assert transfer_config(config).kv_offload_memory == DEFAULT_TRANSFER_MEMORY
    assert transfer_config(EngineConfig(model="m", kv_offload_memory=5 << 20)
                           ).kv_offload_memory == 5 << 20  # fmt: skip


def _serve_args(*argv: str) -> argparse.Namespace:
    from inferd.commands.serve_args import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_serve_flags_refuse_what_cannot_go_with_disaggregate():
    from inferd.commands.serve_disaggregation import disaggregates

    assert not disaggregates(_serve_args())
    assert disaggregates(_serve_args("--disaggregate", "--prefill-engines", "2"))
    for argv, needle in [
        (["--prefill-engines", "2"], "needs --disaggregate"),
        (["--disaggregate-min-prompt", "0"], "needs --disaggregate"),
        (["--disaggregate", "--ray"], "--ray"),
        (["--disaggregate", "--enable-lora"], "--enable-lora"),
        (["--disaggregate", "--wake-on-request"], "sleep"),
        (["--disaggregate", "--data-parallel-size", "2"], "--data-parallel-size"),
        (["--disaggregate", "--no-engine-core-process"], "engine core processes"),
        (["--disaggregate", "--model", "a=x", "--model", "b=y"], "several models"),
    ]:
        with pytest.raises(ValueError, match=needle):
            disaggregates(_serve_args(*argv))


def test_metrics_show_each_engines_role_and_transfers():
    from inferd.server.metrics.prometheus import ServerMetrics

    ledger = TransferLedger(engine_roles(1, 1))
    ledger.handed_over(0, 0.5)
    ledger.arrived(1, handed_blocks=4, cached_tokens=32, block_size=BS)
    tiers = [TierStats("memory", bytes_written=1000), TierStats("memory", bytes_read=900)]
    replicas = [ledger.annotate(i, _stats(t)) for i, t in enumerate(tiers)]
    metrics = ServerMetrics("m", replica_stats=lambda: replicas)
    text = metrics.render(merge_stats(replicas)).decode()
    assert 'inferd:engine_role{engine="0",model_name="m",role="prefill"} 1.0' in text
    assert 'inferd:engine_role{engine="1",model_name="m",role="decode"} 1.0' in text
    assert 'inferd:kv_transfer_bytes_total{engine="0",model_name="m"} 1000.0' in text
    assert 'inferd:kv_transfer_bytes_total{engine="1",model_name="m"} 900.0' in text
    assert 'inferd:kv_transfer_blocks_recomputed_total{engine="1",model_name="m"} 2.0' in text
    assert 'inferd:kv_transfer_seconds_total{engine="0",model_name="m"} 0.5' in text
    colocated = ServerMetrics("m").render(_stats()).decode()
    assert "engine_role" not in colocated and "kv_transfer" not in colocated


def test_the_transfer_watch_waits_for_the_last_blocks_file(tmp_path):
    import asyncio

    from inferd.engine.disaggregation.transfer_watch import TransferWatch
    from inferd.engine.kv_tiers.block_store import block_path

    watch = TransferWatch(tmp_path / "tier")
    name = bytes(range(32))
    assert not watch.written(name)  # no tier folder yet
    path = block_path(tmp_path / "tier" / "identity", name)
    path.parent.mkdir(parents=True)
    assert not asyncio.run(watch.wait(name, timeout=0.02))

    async def written_later() -> bool:
        async def write() -> None:
            await asyncio.sleep(0.01)
            path.write_bytes(b"x")

        task = asyncio.ensure_future(write())
        found = await watch.wait(name, timeout=5)
        await task
        return found

    assert asyncio.run(written_later())

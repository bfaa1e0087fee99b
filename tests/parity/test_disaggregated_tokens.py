"""Prefill and decode on two engine processes (engine/disaggregation/) give the greedy tokens of
colocated serving, in the default mode (its kernels are batch- and chunk-invariant, so a decode
engine that loads the prompt's blocks and computes only the last partial one must sample the
same tokens): on a tiny random Llama GGUF, with the KV handed over, with a prompt its decode
engine already holds (no prefill), with the handed blocks lost before the decode engine reads
them (recomputed, counted), and with the prefill engine killed while prompts wait on it (they
are computed on the decode engine)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from tiny_gguf import write_tiny_gguf

from inferd import LLM, SamplingParams
from inferd.config import EngineConfig
from inferd.engine.disaggregation.client import DisaggregatedClient
from inferd.engine.kv_tiers.connector import memory_tier_root

KW = dict(kv_cache_memory=8 << 20, max_model_len=256, kv_offload_memory=64 << 20)
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def _prompt(seed: int, length: int) -> list[int]:
    return [1] + [(seed * 131 + 7 * i) % 500 + 3 for i in range(length - 1)]


PROMPTS = [_prompt(s, n) for s, n in enumerate((40, 97, 130, 200, 63, 150, 181))]


async def _collect(client, rid, prompt):
    queue: asyncio.Queue = asyncio.Queue()
    await client.add_request(rid, {"prompt_token_ids": prompt}, GREEDY, queue)
    while True:
        item = await asyncio.wait_for(queue.get(), 120)
        if isinstance(item, BaseException):
            raise item
        if item.finished:
            return item


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf"
    write_tiny_gguf(path, "llama")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("INFERD_WEIGHT_CACHE", "0")
        yield path


def test_disaggregated_greedy_tokens_are_colocated_ones(model):
    colocated = LLM(model=str(model), kv_cache_memory=8 << 20, max_model_len=256)
    try:
        expected = [o.outputs[0].token_ids
                    for o in colocated.generate(PROMPTS, GREEDY, use_tqdm=False)]  # fmt: skip
    finally:
        colocated.shutdown()
    client = DisaggregatedClient(EngineConfig(model=str(model), **KW), 1, 1, min_prompt=0)
    client.launch()
    bs = client.router.block_size

    async def body():
        client.start()
        # 1. handed over: the prefill engine computes, the decode engine loads and samples
        outs = await asyncio.gather(*(_collect(client, f"a{i}", p)
                                      for i, p in enumerate(PROMPTS[:3])))  # fmt: skip
        assert [o.outputs[0].token_ids for o in outs] == expected[:3]
        assert client.routes == {"prefill": 3}
        for out, prompt in zip(outs, PROMPTS[:3], strict=True):
            assert out.num_cached_tokens == (len(prompt) - 1) // bs * bs  # every full block
        prefill, decode = client.replica_stats()
        assert (prefill.engine_role, decode.engine_role) == ("prefill", "decode")
        assert prefill.kv_transfers == decode.kv_transfers == 3
        assert decode.kv_transfer_blocks_recomputed == 0
        assert decode.kv_transfer_bytes > 0 and prefill.kv_transfer_bytes > 0
        # 2. a prompt the decode engine holds whole skips prefill
        again = await _collect(client, "b", PROMPTS[1])
        assert again.outputs[0].token_ids == expected[1] and client.routes["cached"] == 1
        # 3. the handed blocks are lost before the decode engine reads them: recomputed
        to_decode = client._to_decode

        def lose_the_blocks(request_id, handoff):
            for path in memory_tier_root(os.getpid()).rglob("*.kv"):
                path.unlink()
            to_decode(request_id, handoff)

        client._to_decode = lose_the_blocks
        lost = await _collect(client, "c", PROMPTS[3])
        client._to_decode = to_decode
        assert lost.outputs[0].token_ids == expected[3] and lost.num_cached_tokens == 0
        assert client.replica_stats()[1].kv_transfer_blocks_recomputed == (200 - 1) // bs
        # 4. the prefill engine dies with prompts waiting on it: the decode engine computes them
        prefill_pid = client.replicas[0].process.process.pid
        os.kill(prefill_pid, signal.SIGSTOP)
        tasks = [asyncio.ensure_future(_collect(client, f"d{i}", p))
                 for i, p in enumerate(PROMPTS[4:6])]  # fmt: skip
        for _ in range(200):
            if len(client._handoffs) == 2:
                break
            await asyncio.sleep(0.01)
        assert set(client._handoffs) == {"d0", "d1"}
        os.kill(prefill_pid, signal.SIGKILL)
        outs = await asyncio.gather(*tasks)
        assert [o.outputs[0].token_ids for o in outs] == expected[4:6]
        assert client.health() is None  # the decode engine serves on
        after = await _collect(client, "e", PROMPTS[6])
        assert after.outputs[0].token_ids == expected[6] and client.routes["no-prefill"] == 1

    try:
        asyncio.run(body())
    finally:
        client.stop(10)

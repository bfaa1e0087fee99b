"""Tensor parallelism on CPU: 2 processes over gloo on loopback."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from tiny_models import make_tiny_checkpoint

from inferd import LLM, SamplingParams
from inferd.engine.execution.runner import SequenceStep
from inferd.errors import EngineDeadError

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPTS = [[1, 17, 250, 33, 98, 5, 77, 120, 200, 41, 9, 63], [1, 5, 6], [1] + list(range(40, 80))]


def _outputs(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def _prompt_logits(llm: LLM, prompt: list[int]) -> torch.Tensor:
    engine = llm.engine
    tables = [list(range(1, 1 + -(-len(prompt) // 16)))] * len(engine.runner.kv_caches)
    engine.runner.clear_blocks(tables)
    return engine.runner.execute([SequenceStep(prompt, 0, tables)])[0]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    # llama: 4 heads / 2 KV heads split; gemma3: 4 heads / 1 KV head replicated on both ranks.
    return {kind: make_tiny_checkpoint(kind, root / kind) for kind in ("llama", "gemma3", "qwen2")}


@pytest.mark.parametrize("kind", ["llama", "gemma3", "qwen2"])
def test_tp2_matches_tp1_on_tiny_checkpoints(checkpoints, kind):
    kw = dict(model=str(checkpoints[kind]), dtype="float32", kv_cache_memory=8 << 20,
              max_model_len=128, enable_prefix_caching=False)  # fmt: skip
    one = LLM(**kw)
    two = LLM(tensor_parallel_size=2, **kw)
    try:
        assert _outputs(two) == _outputs(one)
        # Logits agree to float32 rounding of the all-reduced partial sums.
        torch.testing.assert_close(
            _prompt_logits(two, PROMPTS[2]), _prompt_logits(one, PROMPTS[2]), rtol=1e-5, atol=1e-5
        )
        reports = two.engine.runner.reports()
        assert [r["rank"] for r in reports] == [0, 1]
        assert len({r["pid"] for r in reports}) == 2  # two processes
    finally:
        two.shutdown()


@pytest.mark.slow
def test_tp2_on_the_embedded_model_splits_weights_and_matches(gemma_llm):
    two = LLM(dtype="float32", kv_cache_memory=64 << 20, max_num_batched_tokens=512,
              tensor_parallel_size=2)  # fmt: skip
    try:
        prompts = ["What is CUDA?", "def fibonacci(n):"]
        ref = [o.outputs[0].token_ids for o in gemma_llm.generate(prompts, GREEDY, use_tqdm=False)]
        got = [o.outputs[0].token_ids for o in two.generate(prompts, GREEDY, use_tqdm=False)]
        assert got == ref
        full = sum(p.numel() * p.element_size() for p in gemma_llm.engine.runner.model.parameters())
        norms = sum(
            p.numel() * p.element_size()
            for n, p in gemma_llm.engine.runner.model.named_parameters()
            if "norm" in n
        )
        for r in two.engine.runner.reports():
            # Sharded: the vocabulary, q heads, MLP; replicated: norms and the one KV head
            # (k/v projections: 2 x 18 x 256 x 640 float32 = 23.6 MB).
            kv_proj = 2 * 18 * 256 * 640 * 4
            expected = (full - norms - kv_proj) / 2 + norms + kv_proj
            assert abs(r["weight_bytes"] - expected) / expected < 0.01, r
    finally:
        two.shutdown()


def test_killed_worker_fails_requests_and_kills_the_engine(checkpoints):
    llm = LLM(model=str(checkpoints["llama"]), dtype="float32", kv_cache_memory=8 << 20,
              max_model_len=128, tensor_parallel_size=2, distributed_timeout=20)  # fmt: skip
    engine = llm.engine
    try:
        engine.add_request("a", PROMPTS[0], SamplingParams(max_tokens=100, ignore_eos=True))
        engine.add_request("b", PROMPTS[1], SamplingParams(max_tokens=100, ignore_eos=True))
        engine.step()
        engine.step()
        worker = engine.runner.procs[0]
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(10)
        start = time.monotonic()
        with pytest.raises(EngineDeadError):
            for _ in range(50):
                engine.step()
        assert time.monotonic() - start < 15
        assert engine.dead and not engine.requests
        with pytest.raises(EngineDeadError):
            engine.add_request("c", PROMPTS[0], GREEDY)
    finally:
        llm.shutdown()
    assert not any(p.is_alive() for p in engine.runner.procs)


def test_hung_worker_times_out(checkpoints):
    llm = LLM(model=str(checkpoints["llama"]), dtype="float32", kv_cache_memory=8 << 20,
              max_model_len=128, tensor_parallel_size=2, distributed_timeout=5)  # fmt: skip
    engine = llm.engine
    worker = engine.runner.procs[0]
    try:
        engine.add_request("a", PROMPTS[0], SamplingParams(max_tokens=100, ignore_eos=True))
        engine.step()
        os.kill(worker.pid, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(EngineDeadError):
            for _ in range(50):
                engine.step()
        assert time.monotonic() - start < 30  # the collective timeout (5 s), not forever
    finally:
        os.kill(worker.pid, signal.SIGCONT)
        llm.shutdown()
    assert not worker.is_alive()


def test_heads_that_do_not_divide_are_refused_before_spawning(checkpoints):
    with pytest.raises(ValueError, match="tensor_parallel_size 3"):
        LLM(model=str(checkpoints["llama"]), dtype="float32", tensor_parallel_size=3)


def test_ranks_started_like_torchrun_join_over_loopback(checkpoints):
    """Two separate `inferd generate` processes given torchrun's environment (as on two
    machines): rank 0 prints the continuation, rank 1 serves its shard and exits with it."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "inferd", "generate", "The quick brown fox", "--model",
           str(checkpoints["llama"]), "--dtype", "float32", "--max-tokens", "8", "--quiet",
           "--kv-cache-memory", "8MiB", "--max-model-len", "128"]  # fmt: skip
    single = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert single.returncode == 0, single.stderr
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2")
    procs = [
        subprocess.Popen(
            cmd + ["--tensor-parallel-size", "2"],
            env=dict(env, RANK=str(rank)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for rank in (0, 1)
    ]
    try:
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    assert outs[0][0] == single.stdout  # the same continuation as one process
    assert outs[1][0] == ""  # the worker prints nothing


def test_memory_measure_reports_each_rank(checkpoints):
    from inferd.loader import open_checkpoint
    from inferd.memory import estimate_memory
    from inferd.memory.measure import measure_memory

    ckpt = open_checkpoint(checkpoints["llama"])
    est = estimate_memory(ckpt.config, dtype="fp32", max_model_len=128, concurrency=2,
                          tensor_parallel_size=2, device="cpu")  # fmt: skip
    m = measure_memory(str(checkpoints["llama"]), ckpt.config, est, max_tokens=4, make_llm=LLM)
    rows = {what: (pred, got) for what, pred, got, _ in m.rows}
    for rank in (0, 1):
        pred, got = rows[f"rank {rank}: weights held"]
        assert abs(got - pred) / pred < 0.05  # the per-rank prediction, confirmed per rank
        assert rows[f"rank {rank}: process RSS"][1] > got

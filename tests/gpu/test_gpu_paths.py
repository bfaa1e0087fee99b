"""GPU paths: skipped (with the reason) on machines without CUDA. `scripts/gpu_check.sh` runs
them on a GPU machine together with the GPU benchmarks."""

from __future__ import annotations

import os

import pytest
import torch

from inferd.engine.execution.cuda_graphs import _decode_partitions, capture_sizes

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_capture_sizes_cover_every_batch():
    sizes = capture_sizes(50)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 50
    assert all(any(s >= n for s in sizes) for n in range(1, 51))
    assert capture_sizes(1) == [1]


def test_decode_partitions_are_powers_of_two_in_range():
    for batch in (1, 3, 64, 256):
        p = _decode_partitions(batch, 1, 132)
        assert 1 <= p <= 16 and p & (p - 1) == 0
    assert _decode_partitions(1, 1, 132) == 16
    assert _decode_partitions(512, 1, 132) == 1  # the batch alone fills the GPU


@needs_cuda
@pytest.mark.gpu
def test_cuda_graph_decode_matches_eager(tmp_path):
    from tiny_models import make_tiny_checkpoint

    from inferd import LLM, SamplingParams

    folder = make_tiny_checkpoint("gemma3", tmp_path / "g")
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = [[1, 5, 9, 200, 7], [1, 44, 45], [1] + list(range(30, 90))]
    outs = {}
    for eager in (True, False):
        llm = LLM(model=str(folder), dtype="float32", device="cuda", enforce_eager=eager,
                  kv_cache_memory=64 << 20, max_num_seqs=8)  # fmt: skip
        outs[eager] = [
            o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)
        ]
        if not eager:
            assert llm.engine.runner.graphs is not None
    assert outs[True] == outs[False]


@needs_cuda
@pytest.mark.gpu
def test_gpu_greedy_matches_cpu_on_embedded_model():
    """On the embedded model, or on INFERD_GPU_MODEL (scripts/gpu_standin.py: its shapes,
    random weights) where the GPU machine cannot install it."""
    from inferd import LLM, SamplingParams

    model = os.environ.get("INFERD_GPU_MODEL")  # None: the embedded model
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = ["What is CUDA?", "def fibonacci(n):"]
    cpu = LLM(model=model, dtype="float32", device="cpu", kv_cache_memory=256 << 20)
    gpu = LLM(model=model, dtype="float32", device="cuda", kv_cache_memory=256 << 20)
    a = [o.outputs[0].token_ids for o in cpu.generate(prompts, params, use_tqdm=False)]
    b = [o.outputs[0].token_ids for o in gpu.generate(prompts, params, use_tqdm=False)]
    assert a == b

"""The default mode keeps its invariance with an int8 KV cache (inferd/kv_int8.py): each row's
scale depends only on its own vector, so a prompt's greedy tokens alone equal those in a batch,
prefilled in chunks of 16 tokens, and with n-gram speculation, token for token; on a tiny
random GGUF model (the C decoder layer quantising as it stores, at every step)."""

from __future__ import annotations

import pytest
import torch
from test_engine_invariance import SPECULATION, DefaultMode, _llm, _prompts, _repeating
from tiny_gguf import VOCAB, write_tiny_gguf

INT8 = dict(kv_cache_dtype="int8", kv_cache_memory=16 << 20)


@pytest.fixture(scope="module")
def int8_mode(tmp_path_factory, c_kernels):
    path = tmp_path_factory.mktemp("tiny") / "tiny-qwen3.gguf"  # q/k norms, 2 KV heads of 32
    write_tiny_gguf(path, "qwen3")
    prompts = _prompts(6, seed=11, low=3, high=VOCAB) + _repeating(4, 12, 3, VOCAB)
    mode = DefaultMode(_llm(str(path), **INT8), str(path), prompts)
    runner = mode.base.engine.runner
    assert runner.model.cpu_decoder is not None and runner.backend.fixed_order
    assert runner.kv_caches[0][0].dtype == torch.int8
    assert runner.kv_caches[0][0].shape[-1] == 32 + 4  # codes, then the scale's bytes
    return mode


@pytest.mark.slow
def test_int8_kv_batch_chunk_and_speculation_invariance(int8_mode):
    int8_mode.check(int8_mode.base)
    int8_mode.check(int8_mode.engine(max_num_batched_tokens=16, max_num_seqs=16, **INT8))
    spec = int8_mode.engine(speculative_config=SPECULATION, **INT8)
    spec.engine.speculation.adaptive = False  # verify every draft found
    int8_mode.check(spec)
    assert spec.engine.speculation.metrics.num_draft_tokens > 0

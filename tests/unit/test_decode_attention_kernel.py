"""The C decode attention (cpu_kernels/decode_attention.c) against attention written out in
PyTorch, on a shuffled paged pool: GQA and MQA, sliding windows, softcapping, and several
sequences of different lengths in one call."""

from __future__ import annotations

import math

import pytest
import torch

from inferd.attention.backend import LayerAttentionSpec
from inferd.attention.cpu_backend import decode_in_c
from inferd.attention.torch_backend import DecodePlan
from inferd.cpu_kernels import build


@pytest.fixture(scope="module")
def lib():
    try:
        return build.load(build.build())
    except build.KernelsUnavailable as e:
        pytest.skip(f"no C compiler here: {e}")


def reference(q, keys, values, scale, softcap):
    """q [H, D] against one sequence's visible keys/values [T, KV, D]."""
    heads, kv_heads = q.shape[0], keys.shape[1]
    k = keys.repeat_interleave(heads // kv_heads, 1).transpose(0, 1)  # [H, T, D]
    v = values.repeat_interleave(heads // kv_heads, 1).transpose(0, 1)
    scores = (q[:, None, :] * k).sum(-1) * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    return (torch.softmax(scores.double(), -1).float()[:, :, None] * v).sum(1)


@pytest.mark.parametrize("heads, kv_heads", [(4, 1), (8, 2), (2, 2)])
@pytest.mark.parametrize("window, softcap", [(None, None), (7, None), (None, 30.0)])
# one sequence: its keys are split into ranges across threads and merged
@pytest.mark.parametrize("lens", [[1, 9, 23], [30]])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_decode_attention_matches_pytorch(lib, heads, kv_heads, window, softcap, lens,
                                          cache_dtype):  # fmt: skip
    torch.manual_seed(heads + (window or 0))
    bs, dim, num_blocks = 4, 40, 40  # 40: not a whole number of 16-float vectors
    pool = torch.randn(2, num_blocks, bs, kv_heads, dim).to(cache_dtype)
    spec = LayerAttentionSpec(num_heads=heads, num_kv_heads=kv_heads, head_dim=dim,
                              scale=1 / math.sqrt(dim), window=window, softcap=softcap,
                              group=0, index_in_group=0)  # fmt: skip
    perm = torch.randperm(num_blocks - 1) + 1  # block 0 is the null block
    tables = [perm[i * 8 : (i + 1) * 8] for i in range(len(lens))]
    firsts = [0 if window is None else max(0, n - window) // bs for n in lens]
    width = max((n - 1) // bs - f + 1 for n, f in zip(lens, firsts))
    blocks = torch.zeros(len(lens), width, dtype=torch.long)
    for i, (n, f) in enumerate(zip(lens, firsts)):
        used = tables[i][f : (n - 1) // bs + 1]
        blocks[i, : len(used)] = used
    plan = DecodePlan(None, blocks.flatten(), width, torch.tensor(firsts) * bs,
                       torch.tensor(lens), window, bs)  # fmt: skip
    q = torch.randn(len(lens), heads, dim)
    out = decode_in_c(lib, q, pool, plan, spec)
    for i, n in enumerate(lens):
        lo = 0 if window is None else max(0, n - window)
        pos = torch.arange(lo, n)
        slots = tables[i][pos // bs] * bs + pos % bs
        keys = pool[0].reshape(-1, kv_heads, dim)[slots].float()
        values = pool[1].reshape(-1, kv_heads, dim)[slots].float()
        expected = reference(q[i], keys, values, spec.scale, softcap)
        torch.testing.assert_close(out[i], expected, rtol=1e-5, atol=1e-5)

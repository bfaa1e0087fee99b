"""The C decode attention (cpu_kernels/decode_attention.c) against attention written out in
PyTorch, on a shuffled paged pool: GQA and MQA, sliding windows, softcapping, and several
sequences of different lengths in one call."""

from __future__ import annotations

import math

import pytest
import torch
from kernel_variants import VARIANT_NAMES, variant_library


@pytest.fixture(scope="module", params=VARIANT_NAMES)
def lib(request):
    return variant_library(request.param)


def decode_in_c(lib, q, pool, blocks, starts, lens, scale, window, softcap):
    """The kernel through its C signature (kernels.h), as the attention backend calls it."""
    n, heads, dim = q.shape
    out = torch.empty_like(q)
    rc = lib.inferd_decode_attention(
        q.data_ptr(), pool[0].data_ptr(), pool[1].data_ptr(), blocks.data_ptr(),
        starts.data_ptr(), lens.data_ptr(), n, blocks.shape[1], pool.shape[2], heads,
        pool.shape[3], dim, scale, window or 0, softcap or 0.0,
        int(pool.dtype == torch.bfloat16), out.data_ptr(),
    )  # fmt: skip
    assert rc == 0
    return out


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
    scale = 1 / math.sqrt(dim)
    perm = torch.randperm(num_blocks - 1) + 1  # block 0 is the null block
    tables = [perm[i * 8 : (i + 1) * 8] for i in range(len(lens))]
    firsts = [0 if window is None else max(0, n - window) // bs for n in lens]
    width = max((n - 1) // bs - f + 1 for n, f in zip(lens, firsts))
    blocks = torch.zeros(len(lens), width, dtype=torch.long)
    for i, (n, f) in enumerate(zip(lens, firsts)):
        used = tables[i][f : (n - 1) // bs + 1]
        blocks[i, : len(used)] = used
    q = torch.randn(len(lens), heads, dim)
    out = decode_in_c(lib, q, pool, blocks, torch.tensor(firsts) * bs, torch.tensor(lens),
                      scale, window, softcap)  # fmt: skip
    for i, n in enumerate(lens):
        lo = 0 if window is None else max(0, n - window)
        pos = torch.arange(lo, n)
        slots = tables[i][pos // bs] * bs + pos % bs
        keys = pool[0].reshape(-1, kv_heads, dim)[slots].float()
        values = pool[1].reshape(-1, kv_heads, dim)[slots].float()
        expected = reference(q[i], keys, values, scale, softcap)
        torch.testing.assert_close(out[i], expected, rtol=1e-5, atol=1e-5)

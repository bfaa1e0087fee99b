"""The `cpu` attention backend (attention in C) against the pure-PyTorch `torch` backend on random
paged steps: decodes alone and mixed with prefill chunks, GQA and MQA, sliding windows behind
long contexts, soft-capping, float32, bfloat16 and int8 caches. In its fixed-order mode every
row is attended in C; otherwise prefill chunks take the torch code, so those rows must match
exactly. fp8 caches take the torch path in both modes."""

from __future__ import annotations

import pytest
import torch

from inferd.attention.backend import AttentionBatch, GroupBatch, LayerAttentionSpec
from inferd.attention.cpu_backend import CpuAttentionBackend
from inferd.attention.torch_backend import TorchAttentionBackend
from inferd.kv_int8 import INT8_KV, quantize

BLOCK = 8


def make_step(q_lens, ctx_lens, heads, kv_heads, window, dtype, seed):
    """A step on shuffled blocks of a zeroed pool whose earlier context holds random values."""
    gen = torch.Generator().manual_seed(seed)
    dim = 32
    seq_lens = [q + c for q, c in zip(q_lens, ctx_lens, strict=True)]
    need = [-(-n // BLOCK) for n in seq_lens]
    free = (torch.randperm(sum(need), generator=gen) + 1).tolist()
    cache = torch.zeros(2, sum(need) + 1, BLOCK, kv_heads, dim)
    tables, slots, positions = [], [], []
    for ctx, q_len, n in zip(ctx_lens, q_lens, need, strict=True):
        table = [free.pop() for _ in range(n)]
        pos = torch.arange(ctx)
        blocks = torch.tensor(table)[pos // BLOCK]
        cache[:, blocks, pos % BLOCK] = torch.randn(2, ctx, kv_heads, dim, generator=gen)
        new = range(ctx, ctx + q_len)
        slots += [table[p // BLOCK] * BLOCK + p % BLOCK for p in new]
        positions += list(new)
        tables.append(table)
    width = max(len(t) for t in tables)
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    group = GroupBatch(torch.tensor(slots), padded, BLOCK, window)
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    batch = AttentionBatch(torch.tensor(starts, dtype=torch.int32),
                           torch.tensor(seq_lens, dtype=torch.int32), torch.tensor(positions),
                           [group], list(q_lens), seq_lens)  # fmt: skip
    qkv = torch.randn(sum(q_lens), heads + 2 * kv_heads, dim, generator=gen)
    return batch, quantize(cache) if dtype == INT8_KV else cache.to(dtype), qkv


@pytest.fixture(scope="module")
def cpu_backend(c_kernels):
    return CpuAttentionBackend(c_kernels)


@pytest.fixture(scope="module")
def torch_prefill_backend(c_kernels):
    return CpuAttentionBackend(c_kernels, fixed_order=False)


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("window, softcap", [(None, None), (5, None), (None, 20.0)])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16, INT8_KV])
@pytest.mark.parametrize("q_lens, ctx_lens", [([1, 1, 1], [3, 20, 41]), ([1, 9, 1], [30, 4, 12])])
def test_cpu_backend_matches_the_torch_backend(cpu_backend, torch_prefill_backend, heads,
                                               kv_heads, window, softcap, cache_dtype, q_lens,
                                               ctx_lens):  # fmt: skip
    batch, cache, qkv = make_step(q_lens, ctx_lens, heads, kv_heads, window, cache_dtype, heads)
    spec = LayerAttentionSpec(heads, kv_heads, 32, 32**-0.5, window, softcap, 0, 0)
    q, k, v = qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :]
    outs, caches = [], []
    for backend in (TorchAttentionBackend(), cpu_backend, torch_prefill_backend):
        layer_cache = cache.clone()
        outs.append(backend.forward(q, k, v, layer_cache, spec, backend.build_metadata(batch)))
        caches.append(layer_cache)
    for c in caches[1:]:
        torch.testing.assert_close(c, caches[0], rtol=0, atol=0)  # the same stores
    ref, fixed, mixed = outs
    decodes = [i for i, (start, n) in enumerate(zip(batch.query_start_loc[:-1], q_lens))
               if n == 1]  # fmt: skip
    rows = torch.tensor([int(batch.query_start_loc[i]) for i in decodes])
    # decode rows: the C kernel in float32 against torch (float32 products on small steps)
    torch.testing.assert_close(fixed[rows], ref[rows], rtol=2e-5, atol=2e-5)
    assert torch.equal(mixed[rows], fixed[rows])  # the same kernel for decode rows
    prefill = torch.ones(len(ref), dtype=torch.bool)
    prefill[rows] = False
    assert torch.equal(mixed[prefill], ref[prefill])  # prefill chunks: the same torch code
    # in C, float32 products (the torch code multiplies a bf16 cache, and int8 rows
    # dequantised, in bf16)
    tolerance = 2e-5 if cache_dtype == torch.float32 else 2e-2
    torch.testing.assert_close(fixed[prefill], ref[prefill], rtol=tolerance, atol=tolerance)


def test_fp8_caches_take_the_torch_path(cpu_backend):
    batch, cache, qkv = make_step([1, 1], [9, 17], 4, 1, None, torch.float32, 0)
    cache = cache.to(torch.float8_e4m3fn)
    spec = LayerAttentionSpec(4, 1, 32, 32**-0.5, None, None, 0, 0)
    q, k, v = qkv[:, :4], qkv[:, 4:5], qkv[:, 5:]
    outs = [
        b.forward(q, k, v, cache.clone(), spec, b.build_metadata(batch))
        for b in (TorchAttentionBackend(), cpu_backend)
    ]
    assert torch.equal(outs[0], outs[1])


def test_metadata_is_built_once_and_read_by_every_layer(cpu_backend):
    batch, cache, qkv = make_step([1, 6, 1], [12, 0, 5], 4, 2, 3, torch.float32, 3)
    metadata = cpu_backend.build_metadata(batch)
    (rows,) = metadata.rows  # one plan of every row per KV group
    assert rows.seq_rows.tolist() == [0, 1, 7, 8]
    assert rows.lens.tolist() == [13, 1, 2, 3, 4, 5, 6, 6]  # each row sees up to itself
    # the window (3) of each sequence's first row decides its first block: keys from 13 - 3
    assert rows.starts.tolist() == [8, 0, 0] and rows.blocks.shape == (3, 1)
    spec = LayerAttentionSpec(4, 2, 32, 32**-0.5, 3, None, 0, 0)
    q, k, v = qkv[:, :4], qkv[:, 4:6], qkv[:, 6:]
    first = cpu_backend.forward(q, k, v, cache.clone(), spec, metadata)
    second = cpu_backend.forward(q, k, v, cache.clone(), spec, metadata)
    assert torch.equal(first, second)
    assert metadata._torch is None  # a fixed-order step on a float32 cache needs no torch plan

"""The C attention (cpu_kernels/decode_attention.c) against attention written out in PyTorch, on a
shuffled paged pool of float32, bfloat16 or int8 rows (inferd/kv_int8.py): GQA and MQA, sliding
windows, softcapping, several sequences with one or many query rows in one call; and its fixed
reduction order: a row gets the same bits alone, in any batch, in any chunking of its prompt and
with any number of threads, in every variant."""

from __future__ import annotations

import math

import pytest
import torch
from kernel_variants import VARIANT_NAMES, variant_library

from inferd.attention.backend import LayerAttentionSpec
from inferd.attention.cpu_backend import RowPlan, attend_in_c
from inferd.kv_int8 import INT8_KV, dequantize, quantize

BS, DIM = 4, 40  # 40: not a whole number of 16-float lanes


@pytest.fixture(scope="module", params=VARIANT_NAMES)
def lib(request):
    return variant_library(request.param)


def as_cache(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Random values as a pool of `dtype`: int8 rows quantised with their scales."""
    return quantize(values) if dtype == INT8_KV else values.to(dtype)


class Pool:
    """A random paged pool and, per sequence, a shuffled block table of 48 blocks."""

    def __init__(self, seqs: int, kv_heads: int, dtype: torch.dtype, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        blocks = 48 * seqs + 1
        self.cache = as_cache(torch.randn(2, blocks, BS, kv_heads, DIM, generator=gen), dtype)
        perm = (torch.randperm(blocks - 1, generator=gen) + 1).view(seqs, 48)
        self.tables = [perm[s] for s in range(seqs)]

    def keys(self, s: int, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The positions' keys and values as the kernel should read them (float32)."""
        pos = torch.arange(lo, hi)
        slots = self.tables[s][pos // BS] * BS + pos % BS
        rows = (self.cache[i].reshape(-1, *self.cache.shape[3:])[slots] for i in (0, 1))
        k, v = (dequantize(r) if r.dtype == INT8_KV else r.float() for r in rows)
        return k, v


def attend(lib, pool: Pool, q: torch.Tensor, rows: list[tuple[int, list[int]]],
           spec: LayerAttentionSpec) -> torch.Tensor:  # fmt: skip
    """The kernel on one call's rows: `rows` lists, per sequence of the call, its pool sequence
    and the positions of its query rows (consecutive), q [rows, H, D] in that order."""
    seq_rows, lens, tables, firsts = [0], [], [], []
    for s, positions in rows:
        seq_rows.append(seq_rows[-1] + len(positions))
        lens += [p + 1 for p in positions]
        lo = 0 if spec.window is None else max(0, positions[0] + 1 - spec.window)
        firsts.append(lo // BS)
        table = pool.tables[s][lo // BS :]
        tables.append(torch.cat([table, table.new_zeros(48 - len(table))]))  # padded
    plan = RowPlan(torch.tensor(seq_rows), torch.tensor(lens), torch.stack(tables).long(),
                   torch.tensor(firsts) * BS, BS)  # fmt: skip
    return attend_in_c(lib, q, pool.cache, plan, spec)


def reference(q, keys, values, scale, softcap):
    """q [H, D] against one row's visible keys/values [T, KV, D]."""
    heads, kv_heads = q.shape[0], keys.shape[1]
    k = keys.repeat_interleave(heads // kv_heads, 1).transpose(0, 1)  # [H, T, D]
    v = values.repeat_interleave(heads // kv_heads, 1).transpose(0, 1)
    scores = (q[:, None, :].double() * k).sum(-1) * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    return (torch.softmax(scores, -1)[:, :, None] * v).sum(1).float()


def spec_of(heads, kv_heads, window=None, softcap=None):
    return LayerAttentionSpec(heads, kv_heads, DIM, 1 / math.sqrt(DIM), window, softcap, 0, 0)


@pytest.mark.parametrize("heads, kv_heads", [(4, 1), (8, 2), (2, 2)])
@pytest.mark.parametrize("window, softcap", [(None, None), (7, None), (70, None), (None, 30.0)])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16, INT8_KV])
def test_attention_matches_pytorch(lib, heads, kv_heads, window, softcap, cache_dtype):
    """Decode rows, a prefill chunk of 11 rows crossing a chunk boundary and one from the start,
    and a long context (several 64-key chunks), in one call."""
    pool = Pool(4, kv_heads, cache_dtype, seed=heads + (window or 0))
    rows = [(0, [9]), (1, list(range(58, 69))), (2, [150]), (3, list(range(0, 5)))]
    spec = spec_of(heads, kv_heads, window, softcap)
    q = torch.randn(sum(len(p) for _, p in rows), heads, DIM)
    out = attend(lib, pool, q, rows, spec)
    i = 0
    for s, positions in rows:
        for p in positions:
            lo = 0 if window is None else max(0, p + 1 - window)
            keys, values = pool.keys(s, lo, p + 1)
            expected = reference(q[i], keys, values, spec.scale, softcap)
            torch.testing.assert_close(out[i], expected, rtol=2e-5, atol=2e-5)
            i += 1


@pytest.mark.parametrize("window", [None, 50])
@pytest.mark.parametrize("heads, kv_heads", [(4, 1), (2, 2)])
@pytest.mark.parametrize("cache_dtype", [torch.float32, INT8_KV])
def test_a_row_gets_the_same_bits_however_the_step_is_made(lib, window, heads, kv_heads,
                                                            cache_dtype):  # fmt: skip
    """One prompt's 140 query rows (three 64-key chunks), computed as one prefill chunk, as
    chunks of 16 and of 64 rows, row by row as decode rows, and inside a batch with other
    sequences: the same bits for every row; and with one thread or several. One query head
    per KV head (2, 2): the weighted values of several rows share blocks."""
    pool = Pool(3, kv_heads, cache_dtype)
    spec = spec_of(heads, kv_heads, window)
    positions = list(range(140))
    q = torch.randn(140, heads, DIM, generator=torch.Generator().manual_seed(1))
    whole = attend(lib, pool, q, [(0, positions)], spec)
    for chunk in (16, 64, 1):
        parts = [attend(lib, pool, q[a : a + chunk], [(0, positions[a : a + chunk])], spec)
                 for a in range(0, 140, chunk)]  # fmt: skip
        assert torch.equal(torch.cat(parts), whole), chunk
    others = torch.randn(9, heads, DIM)
    batch = [(1, [30]), (0, positions[70:]), (2, list(range(100, 108)))]
    mixed = attend(lib, pool, torch.cat([others[:1], q[70:], others[1:]]), batch, spec)
    assert torch.equal(mixed[1:71], whole[70:])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(attend(lib, pool, q, [(0, positions)], spec), whole)
        one = attend(lib, pool, q[139:], [(0, [139])], spec)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, whole[139:])


def test_shapes_it_cannot_take_are_refused(lib):
    pool = Pool(1, 2, torch.float32)
    with pytest.raises(RuntimeError, match="attention kernel failed"):
        attend(lib, pool, torch.randn(1, 3, DIM), [(0, [3])], spec_of(3, 2))


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16, INT8_KV])
def test_every_variant_gives_the_portable_bits(lib, cache_dtype):
    """Each variant performs the same IEEE operations (FMAs included: portable's are libm's
    fmaf), its vector code in another shape: the same bits as the plain C, for a head size that
    fills no register (40) and one that fills several (256), prefill and decode rows mixed."""
    portable = variant_library("portable")
    for dim in (DIM, 256):
        gen = torch.Generator().manual_seed(dim)
        cache = as_cache(torch.randn(2, 97, BS, 2, dim, generator=gen), cache_dtype)
        pool = Pool(2, 2, cache_dtype)
        pool.cache = cache
        rows = [(0, list(range(60, 131))), (1, [170])]
        q = torch.randn(72, 4, dim, generator=gen)
        spec = LayerAttentionSpec(4, 2, dim, 1 / math.sqrt(dim), 100, None, 0, 0)
        assert torch.equal(attend(lib, pool, q, rows, spec), attend(portable, pool, q, rows, spec))

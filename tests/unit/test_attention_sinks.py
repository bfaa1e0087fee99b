"""Attention sinks (gpt-oss: per query head a logit in every softmax's denominator, weighing no
value) in every backend: the torch reference against HF's eager formula written out here, the
cpu backend (C kernel, fixed-order and mixed modes, float32 and bfloat16 caches) and the Triton
kernels (prefill, decode unsplit and split) against the torch backend; the C kernel's every
ISA variant gives the portable variant's bits."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any Triton kernel is imported

from kernel_variants import VARIANT_NAMES, variant_library  # noqa: E402
from test_cpu_attention import make_step  # noqa: E402

from inferd.attention.backend import LayerAttentionSpec  # noqa: E402
from inferd.attention.cpu_backend import CpuAttentionBackend, attend_in_c, row_plan  # noqa: E402
from inferd.attention.torch_backend import TorchAttentionBackend, store_kv  # noqa: E402

DIM = 32
# (query rows, cached tokens) per sequence: decodes alone, and mixed with prefill chunks
STEPS = [([1, 1, 1], [3, 20, 70]), ([1, 9, 1], [30, 4, 12]), ([12], [0])]


def spec_of(heads: int, kv_heads: int, window: int | None, seed: int = 0) -> LayerAttentionSpec:
    """Sinks of visible magnitude, some above the scores and some below."""
    gen = torch.Generator().manual_seed(100 + seed)
    sinks = torch.randn(heads, generator=gen) * 3
    return LayerAttentionSpec(heads, kv_heads, DIM, DIM**-0.5, window, None, 0, 0, sinks=sinks)


def split(qkv: torch.Tensor, heads: int, kv_heads: int):
    return qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :]


def hf_eager(q, cache, batch, spec: LayerAttentionSpec) -> torch.Tensor:
    """Each row as HF's eager gpt-oss attention computes it: scores of its visible keys and
    the sink as one more logit, the max taken away, a softmax, the sink's column dropped."""
    k_all, v_all = (cache[i].reshape(-1, spec.num_kv_heads, DIM).float() for i in (0, 1))
    group, table = spec.num_heads // spec.num_kv_heads, batch.groups[0]
    out = torch.empty(q.shape)
    starts = batch.query_start_loc.tolist()
    for s, seq_len in enumerate(batch.seq_lens_cpu):
        for row in range(starts[s], starts[s + 1]):
            pos = seq_len - (starts[s + 1] - row)
            lo = 0 if spec.window is None else max(0, pos + 1 - spec.window)
            keys = torch.arange(lo, pos + 1)
            slots = table.block_tables[s].long()[keys // table.block_size] * table.block_size
            slots = slots + keys % table.block_size
            for h in range(spec.num_heads):
                k, v = k_all[slots, h // group], v_all[slots, h // group]
                scores = (k @ q[row, h].float()) * spec.scale
                logits = torch.cat([scores, spec.sinks[h : h + 1]])
                probs = torch.softmax(logits - logits.max(), dim=-1)[:-1]
                out[row, h] = probs @ v
    return out


def forward(backend, q, k, v, cache, spec, batch) -> torch.Tensor:
    return backend.forward(q, k, v, cache, spec, backend.build_metadata(batch))


@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (4, 1)])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("q_lens, ctx_lens", STEPS)
def test_torch_backend_is_hf_eager_with_sinks(heads, kv_heads, window, q_lens, ctx_lens):
    batch, cache, qkv = make_step(q_lens, ctx_lens, heads, kv_heads, window, torch.float32, 1)
    spec = spec_of(heads, kv_heads, window)
    q, k, v = split(qkv, heads, kv_heads)
    out = forward(TorchAttentionBackend(), q, k, v, cache, spec, batch)
    torch.testing.assert_close(out, hf_eager(q, cache, batch, spec), rtol=1e-5, atol=1e-5)
    plain = dataclasses.replace(spec, sinks=None)
    without = forward(TorchAttentionBackend(), q, k, v, cache.clone(), plain, batch)
    assert (out - without).abs().max() > 0.05  # the sinks take a visible share


@pytest.fixture(scope="module")
def backends(c_kernels):
    return CpuAttentionBackend(c_kernels), CpuAttentionBackend(c_kernels, fixed_order=False)


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("q_lens, ctx_lens", STEPS)
def test_cpu_backend_matches_torch_with_sinks(backends, heads, kv_heads, window, cache_dtype,
                                              q_lens, ctx_lens):  # fmt: skip
    batch, cache, qkv = make_step(q_lens, ctx_lens, heads, kv_heads, window, cache_dtype, 2)
    spec = spec_of(heads, kv_heads, window, heads + kv_heads)
    q, k, v = split(qkv, heads, kv_heads)
    ref = forward(TorchAttentionBackend(), q, k, v, cache.clone(), spec, batch)
    tolerance = 2e-5 if cache_dtype == torch.float32 else 2e-2  # torch multiplies bf16 in bf16
    for backend in backends:
        got = forward(backend, q, k, v, cache.clone(), spec, batch)
        torch.testing.assert_close(got, ref, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("variant", VARIANT_NAMES)
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_every_variant_gives_the_portable_bits_with_sinks(variant, cache_dtype):
    lib, portable = variant_library(variant), variant_library("portable")
    batch, cache, qkv = make_step([1, 40, 1], [150, 30, 7], 8, 2, 100, cache_dtype, 3)
    spec = spec_of(8, 2, 100)
    q, k, v = split(qkv, 8, 2)
    store_kv(cache, batch.groups[0].slot_mapping, k, v)
    rows = row_plan(batch, batch.groups[0], batch.query_start_loc.long(), batch.positions + 1)
    assert torch.equal(attend_in_c(lib, q, cache, rows, spec),
                       attend_in_c(portable, q, cache, rows, spec))  # fmt: skip


# --- Triton (the interpreter on CPU) ---------------------------------------------------------


@pytest.fixture(scope="module")
def triton_backends():
    pytest.importorskip("triton", reason="triton is not importable", exc_type=ImportError)
    from inferd.attention.triton_backend import TritonAttentionBackend
    from inferd.attention.triton_kernels.common import interpreted
    from inferd.attention.triton_kernels.store_kv import _store_kv_kernel

    if not torch.cuda.is_available() and not interpreted(_store_kv_kernel):
        pytest.skip("the triton kernels were imported before TRITON_INTERPRET=1 was set")
    split_decode = TritonAttentionBackend(decode_partitions=4, min_partition=16)
    return TritonAttentionBackend(), split_decode


@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (4, 1)])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("q_lens, ctx_lens", STEPS)
def test_triton_matches_torch_with_sinks(triton_backends, heads, kv_heads, window, q_lens,
                                         ctx_lens):  # fmt: skip
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batch, cache, qkv = make_step(q_lens, ctx_lens, heads, kv_heads, window, torch.float32, 4)
    spec = spec_of(heads, kv_heads, window, 7)
    q, k, v = split(qkv, heads, kv_heads)
    ref = forward(TorchAttentionBackend(), q, k, v, cache.clone(), spec, batch)
    moved = dataclasses.replace(spec, sinks=spec.sinks.to(device))
    on = batch if device.type == "cpu" else _to(batch, device)
    for backend in triton_backends:
        got = forward(backend, q.to(device), k.to(device), v.to(device), cache.clone().to(device),
                      moved, on)  # fmt: skip
        torch.testing.assert_close(got.cpu(), ref, rtol=2e-5, atol=2e-5)


def _to(batch, device):
    groups = [dataclasses.replace(g, slot_mapping=g.slot_mapping.to(device),
                                  block_tables=g.block_tables.to(device))
              for g in batch.groups]  # fmt: skip
    return dataclasses.replace(batch, query_start_loc=batch.query_start_loc.to(device),
                               seq_lens=batch.seq_lens.to(device),
                               positions=batch.positions.to(device), groups=groups)  # fmt: skip

"""The Triton paged-attention backend against the torch reference.

On a machine without CUDA the kernels run on CPU tensors under the Triton interpreter
(`TRITON_INTERPRET=1`, set here before the kernels are imported), on small shapes. With CUDA
they run compiled on the GPU. Every case fills the KV pool with NaN and writes only the slots a
real engine would have written (and, behind a sliding window, drops blocks to the null block
0), so a kernel that lets a slot it should not see reach its result fails the comparison.

Tolerances: float32 within 2e-5 of the reference; bfloat16 within 3e-2 and float16 within 5e-3
(atol and rtol), since the reference may round its prefill scores to the half dtype where the
kernels keep them in float32. The kernels must also be at least as close to a float32 ground
truth as the half-precision reference is.

int8 caches (inferd/kv_int8.py): "NaN" is a row of 0xFF bytes (codes -1, a NaN scale), so a
read of an unwritten row still poisons the result. The kernels must store PyTorch's bytes, and
attend within 2e-5 of float32 attention over the same dequantised values.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, replace

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip(
    "triton", reason="triton is not importable (pip install triton)", exc_type=ImportError
)

from inferd.attention.backend import (  # noqa: E402
    AttentionBatch,
    GroupBatch,
    LayerAttentionSpec,
)
from inferd.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from inferd.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from inferd.attention.triton_kernels import store_kv  # noqa: E402
from inferd.attention.triton_kernels.common import interpreted  # noqa: E402
from inferd.attention.triton_kernels.store_kv import _store_kv_kernel  # noqa: E402
from inferd.kv_int8 import INT8_KV, dequantize, quantize, scales  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if DEVICE.type == "cpu" and not interpreted(_store_kv_kernel):
    pytest.skip(
        "the triton kernels were imported before TRITON_INTERPRET=1 was set; run this file alone",
        allow_module_level=True,
    )

TOL = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
    torch.float16: dict(atol=5e-3, rtol=5e-3),
}


@dataclass
class Case:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cache: torch.Tensor
    spec: LayerAttentionSpec
    batch_args: dict

    def batch(self) -> AttentionBatch:
        """The step's layout, fresh, as the runner builds it every step."""
        args = dict(self.batch_args)
        args["groups"] = [replace(g) for g in args["groups"]]
        return AttentionBatch(**args)

    def forward(self, backend, cache: torch.Tensor, **inputs) -> torch.Tensor:
        """One layer's attention, the backend's metadata built for the step as the runner
        does."""
        q, k, v = (inputs.get(n, getattr(self, n)) for n in ("q", "k", "v"))
        metadata = backend.build_metadata(self.batch())
        return backend.forward(q, k, v, cache, self.spec, metadata)


def make_case(
    q_lens: list[int],
    ctx_lens: list[int],
    *,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 32,
    block_size: int = 8,
    window: int | None = None,
    softcap: float | None = None,
    dtype: torch.dtype = torch.float32,
    cache_dtype: torch.dtype | None = None,  # default: `dtype`
    seed: int = 0,
) -> Case:
    """A step of sequences with `ctx_lens` cached tokens adding `q_lens` new ones, on shuffled
    blocks of a NaN-filled pool in which only the visible context slots hold values."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [q + c for q, c in zip(q_lens, ctx_lens, strict=True)]
    need = [triton.cdiv(n, block_size) for n in seq_lens]
    num_blocks = 1 + sum(need) + 3  # block 0 is the null block; a few spare blocks stay unused
    free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    cache_dtype = cache_dtype or dtype
    shape = (2, num_blocks, block_size, kv_heads, head_dim)
    if cache_dtype == INT8_KV:  # every byte 0xFF: codes -1 and a NaN scale
        cache = torch.full((*shape[:-1], head_dim + 4), -1, dtype=INT8_KV)
    else:
        cache = torch.full(shape, float("nan"), dtype=cache_dtype)
    tables, slots, positions = [], [], []
    for ctx, q_len, n_blocks in zip(ctx_lens, q_lens, need, strict=True):
        table = [free.pop() for _ in range(n_blocks)]
        # Keys the step's first query can see; older ones were written once, but the test
        # leaves them NaN (and blocks wholly behind the window go back to the null block).
        lo = 0 if window is None else max(0, ctx - window + 1)
        table = [0 if (b + 1) * block_size <= lo else blk for b, blk in enumerate(table)]
        pos = torch.arange(lo, ctx)
        blocks = torch.tensor(table, dtype=torch.long)[pos // block_size]
        values = torch.randn(2, len(pos), kv_heads, head_dim, generator=gen)
        cache[:, blocks, pos % block_size] = (
            quantize(values) if cache_dtype == INT8_KV else values.to(cache_dtype)
        )
        new = range(ctx, ctx + q_len)
        slots.extend(table[p // block_size] * block_size + p % block_size for p in new)
        positions.extend(new)
        tables.append(table)
    width = max(len(t) for t in tables) + 1  # one more padding column than needed
    tables = [t + [0] * (width - len(t)) for t in tables]
    tokens = sum(q_lens)
    # q, k, v are views into one fused projection output, as the models pass them.
    qkv = torch.randn(tokens, heads + 2 * kv_heads, head_dim, generator=gen).to(dtype)
    q, k, v = qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :]
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    group = GroupBatch(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=DEVICE),
        block_size=block_size,
        window=window,
    )
    batch_args = dict(
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        positions=torch.tensor(positions, dtype=torch.int64, device=DEVICE),
        groups=[group],
        query_lens_cpu=list(q_lens),
        seq_lens_cpu=seq_lens,
    )
    spec = LayerAttentionSpec(heads, kv_heads, head_dim, head_dim**-0.5, window, softcap, 0, 0)
    return Case(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), cache.to(DEVICE), spec, batch_args)


def bits(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns, so that NaN slots compare equal to themselves."""
    if t.element_size() == 1:
        return t
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def written(cache: torch.Tensor) -> torch.Tensor:
    """The pool with its never-written slots zeroed, as the engine zeroes a block before its
    first use (int8: rows whose scale is NaN)."""
    if cache.dtype != INT8_KV:
        return torch.nan_to_num(cache, nan=0.0)
    return torch.where(scales(cache).isnan(), 0, cache)


def run_both(case: Case, backend: TritonAttentionBackend) -> tuple[torch.Tensor, torch.Tensor]:
    # NOTE: the torch reference reads whole cache blocks and relies on the engine zeroing a
    # block before its first use, so it gets the pool with its never-written slots zeroed;
    # the Triton kernels get the NaN-filled pool, proving they never read those slots.
    ref_cache = written(case.cache.clone())
    tri_cache = case.cache.clone()
    ref = case.forward(TorchAttentionBackend(), ref_cache)
    out = case.forward(backend, tri_cache)
    stored = written(tri_cache)
    assert torch.equal(bits(stored), bits(ref_cache)), "the KV store differs"
    assert not out.isnan().any()
    return out, ref


def check(case: Case, backend: TritonAttentionBackend | None = None) -> None:
    out, ref = run_both(case, backend or TritonAttentionBackend())
    torch.testing.assert_close(out, ref, **TOL[case.q.dtype])


SPLIT = TritonAttentionBackend(decode_partitions=4, min_partition=16)


# --- the KV store ---------------------------------------------------------------------------


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_store_kv_writes_exactly_the_given_slots(cache_dtype):
    gen = torch.Generator().manual_seed(1)
    blocks, block_size, kv_heads, head_dim = 6, 8, 2, 24  # head_dim not a power of two
    cache = torch.full((2, blocks, block_size, kv_heads, head_dim), float("nan"), dtype=cache_dtype)
    before = cache.clone()
    slots = torch.tensor([9, 40, 3, 47, -1, 17])  # -1: a padding token, stored nowhere
    kv = torch.randn(len(slots), 3 * kv_heads, head_dim, generator=gen)
    kv[0, 0, :3] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, 2 - 2**-9])  # bf16 ties round to even
    k, v = kv[:, :kv_heads], kv[:, kv_heads : 2 * kv_heads]  # strided views
    cache, slots = cache.to(DEVICE), slots.to(DEVICE)
    store_kv(k.to(DEVICE), v.to(DEVICE), cache, slots)
    cache = cache.cpu()
    flat, old = cache.view(2, -1, kv_heads, head_dim), before.view(2, -1, kv_heads, head_dim)
    real = slots.cpu() >= 0
    written = slots.cpu()[real]
    torch.testing.assert_close(flat[0, written], k[real].to(cache_dtype), atol=0, rtol=0)
    torch.testing.assert_close(flat[1, written], v[real].to(cache_dtype), atol=0, rtol=0)
    untouched = torch.ones(flat.shape[1], dtype=torch.bool)
    untouched[written] = False
    assert torch.equal(bits(flat[:, untouched]), bits(old[:, untouched]))


# --- decode, prefill, mixed -----------------------------------------------------------------

GQA = [(2, 2), (4, 2), (8, 2), (4, 1)]  # ratios 1, 2, 4 and MQA


@pytest.mark.parametrize("heads,kv_heads", GQA)
def test_decode_only(heads, kv_heads):
    case = make_case([1] * 4, [0, 7, 30, 17], heads=heads, kv_heads=kv_heads, seed=heads)
    check(case)


@pytest.mark.parametrize("heads,kv_heads", GQA)
def test_prefill_only(heads, kv_heads):
    # 70 tokens span two query tiles even for one head per KV head (64 rows per tile).
    case = make_case([70, 2, 19], [0, 0, 0], heads=heads, kv_heads=kv_heads, seed=heads)
    check(case)


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_mixed_chunked_prefill_and_decodes(block_size):
    # Chunks after cached context, fresh prompts and decodes in one step, in shuffled order.
    case = make_case([1, 13, 1, 40, 6], [25, 21, 3, 9, 0], block_size=block_size, seed=block_size)
    check(case)


def test_zero_length_queries_are_skipped():
    case = make_case([0, 5, 1], [4, 3, 9], seed=3)
    check(case)


@pytest.mark.parametrize("softcap", [None, 5.0])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 1)])
def test_softcap(softcap, heads, kv_heads):
    case = make_case([9, 1, 1], [5, 12, 3], heads=heads, kv_heads=kv_heads, softcap=softcap)
    check(case)


@pytest.mark.parametrize("window", [1, 5, 12])
def test_sliding_window_shorter_than_context(window):
    # Long contexts behind a short window: early blocks are the null block and NaN-filled.
    case = make_case([1, 10, 1, 3, 20], [44, 30, 6, 37, 0], kv_heads=1, window=window, seed=window)
    check(case)
    check(case, SPLIT)


def test_split_decode_over_many_partitions():
    # 16-key partitions, 4 per sequence at most: long contexts take several, short ones one.
    lens = [100, 3, 64, 17, 33]
    case = make_case([1] * 5, lens, heads=8, kv_heads=2, seed=5)
    check(case, SPLIT)
    mixed = make_case([1, 9, 1, 1], [90, 20, 1, 47], heads=4, kv_heads=1, softcap=3.0, seed=6)
    check(mixed, SPLIT)
    check(mixed, TritonAttentionBackend(decode_partitions=16, min_partition=1))


@pytest.mark.parametrize("head_dim", [24, 256])
def test_head_dims(head_dim):
    # A non-power-of-two head (padded lanes) and Gemma 3's 256 with 4 query heads on 1 KV head.
    case = make_case([1, 11, 1], [20, 6, 40], heads=4, kv_heads=1, head_dim=head_dim, seed=7)
    check(case, SPLIT)


@pytest.mark.parametrize(
    "dtype,window", [(torch.bfloat16, None), (torch.bfloat16, 6), (torch.float16, 6)]
)
def test_half_precision(dtype, window):
    case = make_case([1, 12, 1, 5], [34, 10, 3, 0], heads=4, kv_heads=1, window=window, dtype=dtype)
    out, ref = run_both(case, SPLIT)
    torch.testing.assert_close(out, ref, **TOL[dtype])
    # Ground truth: the reference on the same (half-representable) values in float32.
    exact = Case(
        case.q.float(),
        case.k.float(),
        case.v.float(),
        torch.nan_to_num(case.cache.float(), nan=0.0),  # the reference needs finite slots
        case.spec,
        case.batch_args,
    )
    truth, _ = run_both(exact, TorchAttentionBackend())
    tri_err = (out.float() - truth).abs().max()
    ref_err = (ref.float() - truth).abs().max()
    assert tri_err <= ref_err + 1e-3, (tri_err, ref_err)


def check_int8(case: Case, backend: TritonAttentionBackend) -> None:
    """An int8 cache: the Triton store writes PyTorch's bytes (run_both), and attention is within
    2e-5 of float32 attention over the same dequantised keys and values (the torch path, which
    multiplies dequantised prefill chunks in bf16, within bf16's tolerance)."""
    out, ref = run_both(case, backend)
    torch.testing.assert_close(out, ref, **TOL[torch.bfloat16])
    as_stored = {n: dequantize(quantize(getattr(case, n))) for n in ("k", "v")}
    exact = Case(case.q, as_stored["k"], as_stored["v"],
                 dequantize(written(case.cache)), case.spec, case.batch_args)  # fmt: skip
    truth = exact.forward(TorchAttentionBackend(), exact.cache.clone())
    torch.testing.assert_close(out, truth, **TOL[torch.float32])


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 32), (4, 1, 256), (2, 2, 22)])
@pytest.mark.parametrize("window", [None, 6])
def test_int8_cache(heads, kv_heads, head_dim, window):
    """Decodes (split over partitions and not), prefill chunks after cached context and fresh
    prompts, GQA and MQA, Gemma 3's head of 256, a head of 22 (rows of 26 bytes, not 4-byte
    aligned: no alignment hint), sliding windows with dropped blocks."""
    case = make_case([1, 12, 1, 5], [34, 10, 3, 0], heads=heads, kv_heads=kv_heads,
                     head_dim=head_dim, window=window, cache_dtype=INT8_KV,
                     seed=head_dim)  # fmt: skip
    check_int8(case, SPLIT)
    check_int8(case, TritonAttentionBackend())


def test_int8_store_of_a_bf16_model():
    """A bf16 model's keys and values quantised by the Triton store and by PyTorch: the same
    bytes, ties and an all-zero row included; padding tokens store nothing."""
    case = make_case([3, 1], [5, 9], head_dim=24, dtype=torch.bfloat16, cache_dtype=INT8_KV)
    k = case.k.clone()
    k[0, 0] = 0.0  # an all-zero row: codes 0, scale 0
    k[1, 1, :4] = torch.tensor([127.0, 0.5, 1.5, -2.5])  # scale 1: ties to even
    caches = [case.cache.clone(), case.cache.clone()]
    slots = case.batch().groups[0].slot_mapping.clone()
    slots[2] = -1  # a padding token
    store_kv(k, case.v, caches[0], slots)
    from inferd.attention.torch_backend import store_kv as torch_store_kv

    torch_store_kv(caches[1], slots[slots >= 0], k[slots >= 0], case.v[slots >= 0])
    assert torch.equal(caches[0], caches[1])
    rows = caches[0][0].view(-1, 2, 28)[slots[1]]
    assert rows[1, :4].tolist() == [127, 0, 2, -2] and scales(rows[1]).item() == 1.0


def test_one_metadata_serves_every_layer_of_the_step():
    case = make_case([1, 7, 1], [12, 4, 30], seed=8)
    backend = TritonAttentionBackend()
    metadata = backend.build_metadata(case.batch())
    plan = metadata.groups[0]
    assert plan.num_decode == 2 and plan.prefill_seqs == [(1, 7)]
    caches = [case.cache.clone(), case.cache.clone()]
    first = backend.forward(case.q, case.k, case.v, caches[0], case.spec, metadata)
    second = backend.forward(case.q, case.k, case.v, caches[1], case.spec, metadata)
    assert torch.equal(first, second)
    fixed = backend.build_metadata(case.batch(), decode_partitions=4)
    assert fixed.decode_partitions == 4 and metadata.decode_partitions is None
    with pytest.raises(ValueError, match="decode_partitions"):
        backend.build_metadata(case.batch(), decode_partitions=3)


def test_rejects_a_partition_count_that_is_not_a_power_of_two():
    with pytest.raises(ValueError, match="decode_partitions"):
        TritonAttentionBackend(decode_partitions=3)


# --- end to end -----------------------------------------------------------------------------


def test_tiny_gemma3_runner_matches_the_torch_backend(tmp_path):
    """A tiny random Gemma 3 (sliding window 6 on 2 of 3 layers, 4 query heads on 1 KV head)
    through the model runner: chunked prefill, a mixed step and decodes, with both backends."""
    pytest.importorskip("transformers", reason="the tiny checkpoint is written by transformers")
    from tiny_models import make_tiny_checkpoint

    from inferd.engine.execution.runner import ModelRunner, SequenceStep
    from inferd.loader import load_model, open_checkpoint

    folder = make_tiny_checkpoint("gemma3", tmp_path / "gemma3")
    model = load_model(open_checkpoint(folder), torch.float32, DEVICE)
    groups, block_size = len(model.config.kv_groups()), 8
    backends = [
        TorchAttentionBackend(),
        TritonAttentionBackend(decode_partitions=2, min_partition=8),
    ]
    runners = [
        ModelRunner(model, [24] * groups, block_size, torch.float32, DEVICE, backend=b)
        for b in backends
    ]
    gen = torch.Generator().manual_seed(0)
    ids = (torch.randperm(23, generator=gen) + 1).tolist()
    tables = {"a": [ids[:6]] * groups, "b": [ids[6:12]] * groups}
    a = torch.randint(4, 250, (19,), generator=gen).tolist()
    b = torch.randint(4, 250, (11,), generator=gen).tolist()

    def step(seqs: list[SequenceStep]) -> torch.Tensor:
        ref, out = (r.execute(seqs) for r in runners)
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
        return ref

    logits = step(
        [SequenceStep(a[:10], 0, tables["a"], needs_logits=False), SequenceStep(b, 0, tables["b"])]
    )
    b.append(int(logits[0].argmax()))
    logits = step([SequenceStep(a[10:], 10, tables["a"]), SequenceStep([b[-1]], 11, tables["b"])])
    for _ in range(4):  # both decode the reference's greedy tokens, past the window and a partition
        tokens = logits.argmax(-1).tolist()
        a.append(tokens[0])
        b.append(tokens[1])
        logits = step(
            [
                SequenceStep([a[-1]], len(a) - 1, tables["a"]),
                SequenceStep([b[-1]], len(b) - 1, tables["b"]),
            ]
        )


def test_captured_decode_context_computes_the_eager_step(tmp_path):
    """What a CUDA graph records (engine/execution/cuda_graphs.py): the model over the static
    buffers, with the Triton metadata built once per captured size and its decode split fixed,
    padded to the captured size. Run eagerly here (no graph), it must give the eager step's
    logits."""
    pytest.importorskip("transformers", reason="the tiny checkpoint is written by transformers")
    from tiny_models import make_tiny_checkpoint

    from inferd.engine.execution.cuda_graphs import CUDAGraphDecoder
    from inferd.engine.execution.runner import ModelRunner, SequenceStep
    from inferd.loader import load_model, open_checkpoint

    folder = make_tiny_checkpoint("gemma3", tmp_path / "gemma3")
    model = load_model(open_checkpoint(folder), torch.float32, DEVICE)
    groups = len(model.config.kv_groups())
    runner = ModelRunner(model, [16] * groups, 8, torch.float32, DEVICE,
                         backend=TritonAttentionBackend())  # fmt: skip
    tables = [[[1, 2, 3]] * groups, [[4, 5, 6]] * groups, [[7, 8, 9]] * groups]
    prompts = [[5, 9, 11, 40, 7, 3, 22, 90, 14], [8, 30, 2], [61, 62, 63, 64, 65]]
    for prompt, table in zip(prompts, tables):
        runner.execute([SequenceStep(prompt, 0, table)])
    steps = [SequenceStep([17 + i], len(p), t) for i, (p, t) in enumerate(zip(prompts, tables))]
    graphs = CUDAGraphDecoder(runner, max_batch=8, max_model_len=24)
    bs = graphs.fill(steps)
    assert bs == 4  # 3 sequences padded to the captured size 4
    ctx = graphs._context(bs, decode_partitions=2)
    assert ctx.metadata.decode_partitions == 2
    with torch.inference_mode():
        captured = model.compute_logits(model(graphs.input_ids[:bs], graphs.positions[:bs], ctx))
        eager = runner.execute(steps)  # writes the same slots again
    torch.testing.assert_close(captured[:3], eager, atol=1e-4, rtol=1e-4)


def test_kernels_compile_for_an_h200_without_a_gpu():
    """The interpreter runs the kernels as Python; this runs Triton's compiler and ptxas for
    sm_90 on their Gemma 3 specialisation (with a bf16 and an int8 cache), which needs no GPU
    either."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    module = "inferd.attention.triton_kernels.compile_check"
    run = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", module, "--quick"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    kernels = [line.split()[0] for line in run.stdout.splitlines()]
    assert kernels == ["_prefill_kernel", "_decode_kernel", "_reduce_kernel",
                       "_prefill_kernel", "_decode_kernel",  # int8 cache
                       "_store_kv_kernel", "_store_kv_kernel"]  # fmt: skip
    assert run.stdout.count("int8 cache") == 3

"""The block product's numbers depend on nothing but the row and the weights (block_gemv.c).

For every layout the GGUF types give (4, 5 and 8 bits; blocks of 16 and 32; fp16 and fp32
scales; with and without offsets; stacked parts of different layouts; a last group of rows
padded), in every ISA variant (emulated where this CPU lacks it, tests/kernel_variants.py):
a row alone gives the same bits as the same row at a random place in calls of 2 to 130 rows
(tiles of different heights, the remainder tiles, and the row chunks the threads share out);
and every variant gives the same bits as the portable C, the numeric definition's plain form.
"""

from __future__ import annotations

import ctypes

import pytest
import torch
from kernel_variants import VARIANT_NAMES, available_variants, variant_library

from inferd.layers.gguf_blocks import BlockWeight, stack

RANGES = {8: (-128, 128), 5: (-16, 16), 4: (-8, 8)}
BATCHES = (2, 3, 5, 8, 13, 17, 33, 64, 130)  # 130: more than a chunk of rows (96)


def weight(bits: int, group: int, fp16: bool, offsets: bool, seed: int = 0) -> BlockWeight:
    """40 outputs (groups of 16: the last padded) x 96 inputs, as two stacked parts (one
    kernel call each when their layouts differ; merged when they are the same)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(*RANGES[bits], (40, 96), dtype=torch.int8, generator=g)
    scale = torch.rand(40, 96 // group, generator=g) * 0.02
    scale = scale.half().float() if fp16 else scale + 1e-9  # fp32: not exact in fp16
    offset = torch.randn(40, 96 // group, generator=g) * 0.01 if offsets else None
    rows = (slice(0, 16), slice(16, 40)) if bits != 8 else (slice(0, 24), slice(24, 40))
    return stack([BlockWeight(q[r], scale[r], None if offset is None else offset[r])
                  for r in rows])  # fmt: skip


def mixed_weight() -> BlockWeight:
    """q/k/v of different GGUF types: 5-bit, 8-bit with blocks of 16, and 4-bit with offsets."""
    g = torch.Generator().manual_seed(7)
    parts = [(RANGES[5], 32, False, 24), (RANGES[8], 16, False, 16), (RANGES[4], 32, True, 8)]
    weights = []
    for q_range, group, offsets, rows in parts:
        q = torch.randint(*q_range, (rows, 96), dtype=torch.int8, generator=g)
        scale = torch.rand(rows, 96 // group, generator=g) * 0.02
        offset = torch.randn(rows, 96 // group, generator=g) * 0.01 if offsets else None
        weights.append(BlockWeight(q, scale, offset))
    w = stack(weights)
    assert [p.bits for p in w.parts] == [5, 8, 4]
    return w


LAYOUTS = [(bits, group, fp16, offsets) for bits in (8, 5, 4) for group in (16, 32)
           for fp16 in (True, False) for offsets in (False, True)]  # fmt: skip


def layout_id(layout) -> str:
    bits, group, fp16, offsets = layout
    return f"{bits}bit-B{group}-{'fp16' if fp16 else 'fp32'}{'-offsets' if offsets else ''}"


@pytest.fixture(scope="module", params=VARIANT_NAMES)
def kernels(request):
    return variant_library(request.param)


def activations(rows: int, seed: int) -> torch.Tensor:
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(seed))
    x[::7, :32] = 0  # whole activation blocks of zeros (scale 0)
    return x


def check_alone_equals_batched(w: BlockWeight, seed: int) -> None:
    probes = activations(6, seed)
    alone = torch.cat([w(probes[i : i + 1]) for i in range(len(probes))])
    g = torch.Generator().manual_seed(seed)
    for m in BATCHES:
        x = activations(m, seed + m)
        places = torch.randperm(m, generator=g)[: min(m, len(probes))]
        x[places] = probes[: len(places)]
        y = w(x)
        for i, place in enumerate(places.tolist()):
            assert torch.equal(y[place], alone[i]), (m, place)


@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_a_row_alone_equals_the_same_row_in_any_batch(kernels, layout):
    w = weight(*layout)
    w.lib = kernels
    check_alone_equals_batched(w, seed=sum(layout))


def test_stacked_parts_of_different_types_are_batch_invariant(kernels):
    w = mixed_weight()
    w.lib = kernels
    check_alone_equals_batched(w, seed=11)


@pytest.mark.parametrize("layout", [*LAYOUTS, "mixed"],
                         ids=lambda v: v if isinstance(v, str) else layout_id(v))  # fmt: skip
def test_every_variant_gives_the_portable_bits(layout):
    names = available_variants()
    if names == ["portable"]:
        pytest.skip("only the portable kernels run on this CPU: nothing to compare")
    w = mixed_weight() if layout == "mixed" else weight(*layout, seed=5)
    x = activations(37, seed=3)
    results = {}
    for name in names:
        w.lib = variant_library(name)
        results[name] = w(x)
    for name, y in results.items():
        assert torch.equal(y, results["portable"]), name


@pytest.mark.parametrize("rows", [3, 20])  # 20: tiles reading the weights unpacked once
def test_columns_past_the_matrix_are_never_written(kernels, rows):
    """A part writes its N columns of y (stride ldy), never the padding rows' columns."""
    w = weight(5, 32, True, False)
    part = w.parts[0]  # 40 rows: groups of 16, 16 and 8 (+ 8 padding rows)
    assert part.shape[0] == 40
    x = activations(rows, seed=1)
    y = torch.full((rows, 50), float("nan"))
    rc = kernels.inferd_block_gemv(x.data_ptr(), rows, ctypes.byref(part.struct), y.data_ptr(), 50)
    assert rc == 0
    w.lib = kernels
    assert torch.equal(y[:, :40], w(x))
    assert y[:, 40:].isnan().all()


def test_layouts_the_kernel_cannot_run_are_refused(kernels):
    w = weight(8, 32, True, False)
    x = activations(2, seed=1)
    y = torch.empty(2, 40)
    part = w.parts[0].struct
    assert kernels.inferd_block_gemv(x.data_ptr(), 0, ctypes.byref(part), y.data_ptr(), 40) == -1
    assert kernels.inferd_block_gemv(x.data_ptr(), 2, ctypes.byref(part), y.data_ptr(), 39) == -1
    with pytest.raises(ValueError, match="unsupported block layout: 80 inputs"):
        BlockWeight(torch.zeros(4, 80, dtype=torch.int8), torch.ones(4, 5), None)

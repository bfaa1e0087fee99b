"""The compact block layouts (6-bit q, 4-bit codebook indexes, factored scales and offsets) are
storage only: in every ISA variant (tests/kernel_variants.py) each gives the same products,
dense copies and row lookups, bit for bit, as the plain layout of the same weights (q in 8 bits,
float32 scales and offsets); the K-quants' unpackers give factors whose product is the scale
they always gave; and a cache entry's tensors of the wrong size or type are refused.
"""

from __future__ import annotations

import ctypes

import pytest
import torch
from kernel_variants import VARIANT_NAMES, variant_library
from test_gguf_blocks import random_tensor

from inferd.layers import gguf_blocks
from inferd.layers.gguf_blocks import BlockPart, BlockValues, BlockWeight, packed, stack
from inferd.loader import gguf_quants as gq

# IQ4_NL's values: no 0 among them (a padding row must still take one of them)
CODEBOOK = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
K_QUANTS = (gq.Q2_K, gq.Q3_K, gq.Q4_K, gq.Q5_K, gq.Q6_K)


def factored(rows: int, k: int, group: int, sub_range, negative: bool, g: torch.Generator):
    """(per-block values, (super, sub)): an fp16 super per 256 inputs times small integers."""
    sup = (torch.rand(rows, k // 256, generator=g) * 0.05).half().float()
    sup = -sup if negative else sup
    sub = torch.randint(*sub_range, (rows, k // group), dtype=torch.int8, generator=g)
    return sup.repeat_interleave(256 // group, 1) * sub.float(), (sup, sub)


def compact_and_plain(layout: str, group: int, rows: int = 40, k: int = 512, seed: int = 0
                      ) -> tuple[BlockWeight, BlockWeight]:  # fmt: skip
    """The same weights in a compact layout and in the plain one (8-bit q, float32 scales);
    40 rows: the last of three groups padded."""
    g = torch.Generator().manual_seed(seed)
    values = {}
    if "6bit" in layout:  # Q6_K's q
        values["q"] = torch.randint(-32, 32, (rows, k), dtype=torch.int8, generator=g)
    elif "codebook" in layout:
        index = torch.randint(0, 16, (rows, k), generator=g)
        values["q"] = torch.tensor(CODEBOOK, dtype=torch.int8)[index]
        values["codebook"] = CODEBOOK
    else:  # Q4_K's
        values["q"] = torch.randint(0, 16, (rows, k), dtype=torch.int8, generator=g)
    values["scale"], scale_parts = factored(rows, k, group, (-128, 128), False, g)
    if "offsets" in layout:  # Q4_K's: -dmin (an fp16 of either sign) times mins 0-63
        values["offset"], offset_parts = factored(rows, k, group, (0, 64), True, g)
    if "factored" in layout:
        values["scale_parts"] = scale_parts
        values["offset_parts"] = offset_parts if "offsets" in layout else None
    compact = BlockWeight(**values)
    plain = BlockWeight(values["q"], values["scale"], values.get("offset"), (-128, 127), False)
    return compact, plain


LAYOUTS = ["6bit", "codebook", "factored", "factored-offsets", "6bit-factored",
           "codebook-factored-offsets"]  # fmt: skip


@pytest.fixture(scope="module", params=VARIANT_NAMES)
def kernels(request):
    return variant_library(request.param)


@pytest.mark.parametrize("group", [16, 32])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_compact_layout_gives_the_plain_layouts_bits(kernels, layout, group):
    compact, plain = compact_and_plain(layout, group, seed=group)
    part = compact.parts[0]
    assert part.bits == (6 if "6bit" in layout else 4)
    assert (part.codebook is not None) == ("codebook" in layout)
    assert (part.scale_super is not None) == ("factored" in layout)
    assert (part.offset_super is not None) == ("factored-offsets" in layout)
    assert plain.parts[0].bits == 8 and plain.parts[0].scale.dtype == torch.float32
    compact.lib = plain.lib = kernels
    x = torch.randn(40, 512, generator=torch.Generator().manual_seed(1))
    x[2, :32] = 0  # an all-zero activation block
    for rows in (1, 2, 3, 8, 13, 20, 40):  # from 16 (AVX2), 32 (AVX-512): unpacked once
        assert torch.equal(compact(x[:rows]), plain(x[:rows])), rows
    assert torch.equal(compact.dense(torch.float32), plain.dense(torch.float32))
    assert torch.equal(compact.dense(torch.bfloat16, slice(5, 37)),
                       plain.dense(torch.bfloat16, slice(5, 37)))  # fmt: skip
    ids = torch.tensor([39, 0, 17, 17, 5])
    assert torch.equal(compact.dequantized(ids), plain.dequantized(ids))  # the C kernel's
    assert torch.equal(compact.dequantized(), plain.dequantized())
    assert torch.equal(part.dequantized(ids), plain.dequantized(ids))  # tensor ops
    assert torch.equal(part.integers(ids), plain.parts[0].integers(ids))


def test_the_compact_layouts_take_the_bytes_they_should():
    """Per weight: 6-bit q in 6 bits; a factored scale 8 bits per block of B and 32 per 256
    inputs; a codebook's 16 bytes once."""
    bits = {layout: 8 * compact_and_plain(layout, 16, rows=32)[0].nbytes / (32 * 512)
            for layout in LAYOUTS}  # fmt: skip
    assert bits["6bit"] == 6 + 32 / 16  # fp32 scales
    assert bits["6bit-factored"] == 6 + 8 / 16 + 32 / 256  # Q6_K's 6.625
    assert bits["factored-offsets"] == 4 + 2 * (8 / 16 + 32 / 256)
    assert bits["codebook"] == 4 + 32 / 16 + 16 * 8 / (32 * 512)


@pytest.mark.parametrize("ggml_type", K_QUANTS, ids=gq.type_name)
def test_k_quant_scales_are_their_factors_products_bit_for_bit(ggml_type):
    """unpack's scales and offsets are today's (the fp16 d times the integer sub-block scale;
    offsets -(dmin * m), minus zeros included), and the factors' products equal them in every
    bit; the blocks keep the factors and dequantise to the same bits."""
    rows, cols = 32, 512
    raw = random_tensor(ggml_type, rows, cols, seed=ggml_type)
    block, nbytes = gq.BLOCK_LAYOUT[ggml_type]
    b = torch.from_numpy(raw.copy()).view(-1, nbytes)
    if ggml_type in (gq.Q2_K, gq.Q4_K, gq.Q5_K):  # dmin: both signs and zero
        dmin_at = 82 if ggml_type == gq.Q2_K else 2
        dmin = torch.tensor([0.0, -0.0, 0.01, -0.01], dtype=torch.float16).repeat(len(b) // 4)
        b[:, dmin_at : dmin_at + 2] = dmin.view(torch.uint8).view(-1, 2)
    raw = b.view(-1).numpy()
    values = gq.unpack(raw, ggml_type, (rows, cols))
    expected_scale, expected_offset = today(b, ggml_type)

    def bits(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(rows, -1).contiguous().view(torch.int32)

    assert torch.equal(bits(values.scale), bits(expected_scale))
    sup, sub = values.scale_parts
    per = 256 // (cols // values.scale.shape[1])
    assert torch.equal(bits(sup.repeat_interleave(per, 1) * sub.float()), bits(values.scale))
    assert (values.offset is None) == (expected_offset is None) == (values.offset_parts is None)
    if values.offset is not None:
        assert torch.equal(bits(values.offset), bits(expected_offset))
        assert (bits(values.offset) == torch.tensor(-0.0).view(torch.int32)).any()  # it matters
        sup, sub = values.offset_parts
        assert torch.equal(bits(sup.repeat_interleave(per, 1) * sub.float()), bits(values.offset))
    w = BlockWeight(*values)
    assert w.parts[0].scale_super is not None
    assert (w.parts[0].offset_super is not None) == (values.offset is not None)
    assert torch.equal(bits(w.dequantized()), bits(gq.dequantize(raw, ggml_type, (rows, cols))))
    assert 8 * w.nbytes / (rows * cols) == gq.PACKED_BITS[gq.type_name(ggml_type)]


def today(b: torch.Tensor, ggml_type: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The scales and offsets as unpack computed them before they were factored."""
    f16 = gq._f16
    if ggml_type in (gq.Q4_K, gq.Q5_K):
        scale, minimum = gq._k_scale_min(b[:, 4:16])
        return f16(b, 0) * scale, -(f16(b, 2) * minimum)
    if ggml_type == gq.Q6_K:
        return f16(b, 208) * b[:, 192:208].contiguous().view(torch.int8).float(), None
    if ggml_type == gq.Q2_K:
        s = b[:, 0:16]
        return f16(b, 80) * (s & 0xF).float(), -(f16(b, 82) * (s >> 4).float())
    s = b[:, 96:108]  # Q3_K: 16 6-bit scales, low nibbles then 2-bit highs
    low = torch.cat([s[:, 0:8] & 0xF, s[:, 0:8] >> 4], 1)
    high = torch.cat([(s[:, 8:12] >> shift) & 3 for shift in (0, 2, 4, 6)], 1)
    return f16(b, 108) * ((low | (high << 4)).to(torch.int8) - 32).float(), None


def test_parts_that_are_not_the_scales_are_not_stored():
    """Rows reordered without their parts (a llama file's q/k rows): the scales themselves."""
    compact, plain = compact_and_plain("factored-offsets", 32)
    q, scale, offset = plain.parts[0].values()[:3]
    parts = compact.parts[0].values().scale_parts
    swapped = BlockWeight(q.flip(0), scale.flip(0), offset.flip(0), scale_parts=parts)
    assert swapped.parts[0].scale_super is None
    assert torch.equal(swapped.dequantized(), plain.dequantized().flip(0))


def test_a_q_outside_the_codebook_is_refused():
    q = torch.tensor(CODEBOOK, dtype=torch.int8).repeat(2, 2)
    q[1, 5] = 0
    with pytest.raises(ValueError, match="outside its codebook"):
        BlockWeight(q, torch.ones(2, 1), None, codebook=CODEBOOK)
    with pytest.raises(ValueError, match="1 to 16 int8 values"):
        BlockWeight(q, torch.ones(2, 1), None, codebook=(*CODEBOOK[:15], 200))


@pytest.mark.parametrize("layout", ["6bit-factored", "codebook-factored-offsets"])
def test_parts_join_in_their_compact_layout(kernels, layout, monkeypatch):
    """Stacked (whole groups, and not), and packed a range of rows at a time with padding
    rows: the layout kept, the same bits."""
    compact, plain = compact_and_plain(layout, 16)
    values = compact.parts[0].values()

    def rows(first: int, count: int) -> BlockValues:
        def cut(t):
            if t is None or isinstance(t, torch.Tensor):
                return None if t is None else t[first : first + count]
            return tuple(cut(x) for x in t)

        return BlockValues(*[cut(v) if i in (0, 1, 2, 6, 7) else v for i, v in enumerate(values)])

    whole = stack([BlockWeight(*rows(0, 16)), BlockWeight(*rows(16, 24))])
    ragged = stack([BlockWeight(*rows(0, 13)), BlockWeight(*rows(13, 27))])
    monkeypatch.setattr(gguf_blocks, "CHUNK_WEIGHTS", 16 * 512)  # 16 rows at a time
    monkeypatch.setattr(gguf_blocks, "CHUNK_ROWS", 16)
    padded = packed(rows, 40, 512, padded_rows=45)
    x = torch.randn(5, 512)
    plain.lib = kernels
    expected = plain(x)
    for w in (whole, ragged, padded):
        assert len(w.parts) == 1 and w.parts[0].layout() == compact.parts[0].layout()
        w.lib = kernels
        assert torch.equal(w(x)[:, :40], expected)
    assert torch.equal(padded.dequantized()[40:], torch.zeros(5, 512))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_restored_parts_take_their_tensors_only_at_their_sizes(layout):
    part = compact_and_plain(layout, 32)[0].parts[0]
    tensors, facts = part.stored()
    assert {t.dtype for t in tensors.values()} <= {torch.uint8, torch.float16, torch.float32}
    again = BlockPart.restored(tensors, facts)  # what a cache entry gives back
    assert again.layout() == part.layout()
    assert torch.equal(again.dequantized(), part.dequantized())
    factors = {k: t.view(torch.int8) if t.dtype == torch.uint8 and k in ("scale", "offset") else t
               for k, t in tensors.items()}  # fmt: skip
    assert torch.equal(BlockPart.restored(factors, facts).dequantized(), part.dequantized())
    for key in tensors:
        short = {**tensors, key: tensors[key][:-1]}
        with pytest.raises(ValueError, match="sizes"):
            BlockPart.restored(short, facts)
        # as many elements of another type (bytes read as floats would overrun them)
        other = torch.float32 if tensors[key].dtype == torch.uint8 else torch.uint8
        retyped = {**tensors, key: torch.zeros(tensors[key].numel(), dtype=other)}
        with pytest.raises(ValueError, match="sizes"):
            BlockPart.restored(retyped, facts)
    for key in ("high", "scale_super"):
        if key in tensors:  # its bytes missing: facts that read beyond the tensors given
            with pytest.raises(ValueError):
                BlockPart.restored({k: t for k, t in tensors.items() if k != key}, facts)
    bad_facts = [{**facts, "bits": 7}, {**facts, "cols": 500}, {**facts, "rows": "40"},
                 {**facts, "group": 8}, {**facts, "codebook": [1] * 17}]  # fmt: skip
    if "codebook" in facts:
        bad_facts += [{**facts, "codebook": [200] * 16}, {**facts, "zero": 3}]
    for bad in bad_facts:
        with pytest.raises(ValueError):
            BlockPart.restored(tensors, bad)


def test_layouts_the_kernel_cannot_run_are_refused(kernels):
    part = compact_and_plain("6bit-factored", 16)[0].parts[0]
    x = torch.randn(2, 512)
    y = torch.empty(2, 40)

    def runs(**changes) -> int:
        struct = type(part.struct).from_buffer_copy(part.struct)
        for name, value in changes.items():
            setattr(struct, name, value)
        return kernels.inferd_block_gemv(x.data_ptr(), 2, ctypes.byref(struct), y.data_ptr(), 40)

    assert runs() == 0
    assert runs(bits=7) == -1
    assert runs(high=None) == -1  # 6 bits without their high bits
    assert runs(K=480) == -1  # factored scales need whole blocks of 256 inputs
    assert runs(half_scales=1) == -1  # int8 factors are not fp16
    assert runs(codebook=part.q.data_ptr()) == -1  # a codebook indexes 4-bit values only

"""A GGUF file's own block quantisation, kept as it is, and the C kernels that multiply by it.

Every GGUF type (Q4_0 … Q8_0, Q2_K … Q6_K) is, per sub-block of B = 32 (or 16) weights along the
input, `w = scale * q + offset` with small integers q. A `BlockWeight` holds exactly that, so no
weight changes value (unlike re-quantising a dequantised matrix to int8 or int4, which rounds
weights that were already rounded once). q is stored in 4, 5, 6 or 8 bits, whichever its range
needs, or as 4-bit indexes into a codebook of at most 16 values; scales in fp16 where that is
exact, or factored as a K-quant's file has them (a float per 256 inputs times an int8 per block,
their product the scale bit for bit); so a token reads about as many bytes as the GGUF file holds.

The layout is the kernels' (cpu_kernels/block_gemv.c, byte offsets in block_layout.h): output
rows in groups of 16 (the last padded with zero rows), and per group, for each pair of inputs
(a "unit"), the 16 rows' two weights side by side, so that one vector lane per output row
multiplies a broadcast pair of activations; 4-bit (and 5- and 6-bit) units two to a 32-byte
chunk, in the low and high nibbles; the 5-bit layout's fifth bits one 32-bit word per unit, the
6-bit layout's two high bits 2-bit fields of 32 bytes per pair of chunks; block scales and
offsets (or their int8 factors) [groups, K/B, 16], the factors per 256 inputs [groups, K/256,
16]. `integers` and `dequantized` read it back (a few rows, e.g. an embedding lookup, without
unpacking the rest).

`BlockWeight.forward` is the C kernel: each activation row quantised to two int8 terms per
block of 32 values (16-bit precision: llama.cpp's one int8 term flips a few percent of a small
model's argmaxes), exact integer sums per weight block, and per output the same float
operations whatever the step's rows (batch-invariant) and whatever the ISA variant (the
variants agree bit for bit). Tiles of several rows reuse each unpacked weight, so steps of
many rows (prefill) are a GEMM on the blocks, and steps of a few (decode) read them once.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

MAX_PARTS = 4  # row ranges of one layer (q/k/v of different GGUF types): see decode_layer.c

_P, _I = ctypes.c_void_p, ctypes.c_int64


class BlockMatrix(ctypes.Structure):
    """Mirrors the C struct in cpu_kernels/kernels.h."""

    _fields_ = [("q", _P), ("high", _P), ("scale", _P), ("offset", _P), ("N", _I), ("K", _I),
                ("B", _I), ("bits", _I), ("zero", _I), ("half_scales", _I), ("scale_super", _P),
                ("offset_super", _P), ("codebook", _P)]  # fmt: skip


GROUP = 16  # output rows per group (cpu_kernels/block_gemv.c)
# A matrix larger than this many weights is unpacked and packed a range of CHUNK_ROWS rows at a
# time: the unpacked integers (a byte per weight) and their temporaries of a whole embedding
# would be several times its packed size (an 8B model's: 0.5 G weights), one range is not.
CHUNK_WEIGHTS, CHUNK_ROWS = 1 << 25, 4096


class BlockValues(NamedTuple):
    """A block-quantised matrix (or a range of its rows) before packing: weight[r, c] =
    scale[r, c // B] * q[r, c] (+ offset[r, c // B]), B = K / scale.shape[1].
    `value_range`: the (lowest, highest) q its type can hold (None: q's own), so that every
    range of rows of one matrix is stored in the same width and can be joined."""

    q: torch.Tensor  # int8 [rows, K]
    scale: torch.Tensor  # float32 [rows, K / B]
    offset: torch.Tensor | None = None  # float32 [rows, K / B]
    value_range: tuple[int, int] | None = None
    half_scales: bool | None = None  # scales stored as fp16 (exact for the type); None: if exact
    # q's values all lie in this table of at most 16 int8 values (a codebook type: IQ4_NL,
    # MXFP4, ...), so that q can be stored as 4-bit indexes into it; None: q is stored itself
    codebook: tuple[int, ...] | None = None
    # (super float32 [rows, K / 256], sub int8 [rows, K / B]) with scale[r, b] ==
    # super[r, b * B // 256] * sub[r, b] exactly (a K-quant's fp16 d times its small integer
    # sub-block scale), so that scales can be stored in 8 bits; None: not so factored
    scale_parts: tuple[torch.Tensor, torch.Tensor] | None = None
    offset_parts: tuple[torch.Tensor, torch.Tensor] | None = None  # the same for offsets


FEW_ROWS = 16  # row lookups up to this many ids take the C kernel, one call per row


def _grouped(rows: torch.Tensor) -> torch.Tensor:
    """[N, C] → [ceil(N/16), 16, C], the last group padded with zeros (scale 0: the padding
    rows are 0, and the kernels never write them)."""
    n, c = rows.shape
    pad = -n % GROUP
    if pad:
        rows = torch.cat([rows, rows.new_zeros((pad, c))])
    return rows.view(-1, GROUP, c)


def _by_group(per_row: torch.Tensor) -> torch.Tensor:
    """Block scales or offsets [N, K/B] → [ceil(N/16), K/B, 16]: a group's 16 contiguous."""
    return _grouped(per_row).transpose(1, 2).contiguous()


def _units(stored: torch.Tensor) -> torch.Tensor:
    """[G, 16, K] → [G, K/2, 16, 2]: per pair of inputs (a unit), the 16 rows' two values."""
    g, _, k = stored.shape
    return stored.view(g, GROUP, k // 2, 2).transpose(1, 2)


def _pack_nibbles(stored: torch.Tensor, block: int) -> torch.Tensor:
    """[G, 16, K] values' low 4 bits → [G, 8 K] bytes: per block, chunk c (32 bytes, byte 2r + i)
    holds unit c of the block in its low nibbles and unit c + B/4 in its high ones."""
    g, _, k = stored.shape
    v = stored.view(g, GROUP, k // block, 2, block // 4, 2)  # [g, r, b, nibble, c, i]
    v = v.permute(0, 2, 4, 1, 5, 3)  # [g, b, c, r, i, nibble]
    return ((v[..., 0] & 0xF) | (v[..., 1] << 4)).reshape(g, -1)  # uint8: << 4 drops the rest


def _unpack_nibbles(packed: torch.Tensor, block: int, k: int) -> torch.Tensor:
    """One row's bytes of each chunk, [n, K/2] ordered [b, c, i] → its values [n, K]."""
    n = packed.shape[0]
    v = packed.view(n, k // block, 1, block // 4, 2)
    return torch.cat([v & 0xF, v >> 4], dim=2).reshape(n, k)


def _pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """[..., 8 j] of 0/1 → [..., j] bytes, bit i of byte j = element 8j + i."""
    weights = 1 << torch.arange(8, dtype=torch.uint8)
    return (bits.reshape(*bits.shape[:-1], -1, 8) * weights).sum(-1, dtype=torch.uint8)


_HIGH2_SHIFTS = torch.tensor([0, 2, 4, 6], dtype=torch.uint8)


def _pack_high2(stored: torch.Tensor, block: int) -> torch.Tensor:
    """[G, 16, K] 6-bit values' two high bits → [G, 4 K] bytes: per block, 32 bytes per pair of
    chunks (2p, 2p + 1), byte 2r + i holding from bit 0 the bits of chunk 2p's low-nibble unit,
    its high-nibble unit, chunk 2p + 1's low, its high (block_layout.h). Field by field from a
    view: each temporary a quarter of the values' bytes (a first load unpacks 32 M at once)."""
    g, _, k = stored.shape
    v = stored.view(g, GROUP, k // block, 2, block // 8, 2, 2)  # [g, r, b, nibble, p, e, i]
    v = v.permute(0, 2, 4, 1, 6, 5, 3)  # [g, b, p, r, i, e, nibble]
    packed = (v[..., 0, 0] >> 4) | (v[..., 0, 1] >> 4 << 2)
    packed |= (v[..., 1, 0] >> 4 << 4) | (v[..., 1, 1] >> 4 << 6)
    return packed.reshape(g, -1)


def _unpack_high2(packed: torch.Tensor, block: int, k: int) -> torch.Tensor:
    """One row's bytes of each pair of chunks, [n, K/8, 2] ordered [b, p] → its high bits [n, K]
    (in _unpack_nibbles's order)."""
    n = packed.shape[0]
    fields = (packed.unsqueeze(-1) >> _HIGH2_SHIFTS) & 3  # [n, (b, p), i, (e, nibble)]
    v = fields.view(n, k // block, block // 8, 2, 2, 2)  # [n, b, p, i, e, nibble]
    return v.permute(0, 1, 5, 2, 4, 3).reshape(n, k)


def _codebook_indexes(q: torch.Tensor, codebook: tuple[int, ...]) -> torch.Tensor:
    """Each q's index in `codebook`, uint8 [rows, K]; ValueError if a q is not in it. A slice
    at a time: the lookup's int32 indexes of a whole matrix would be 4 bytes per weight."""
    table = torch.full((256,), 255, dtype=torch.uint8)  # 255: not in the codebook
    table[torch.tensor(codebook) + 128] = torch.arange(len(codebook), dtype=torch.uint8)
    flat = q.reshape(-1)
    out = torch.empty(flat.shape, dtype=torch.uint8)
    for start in range(0, flat.numel(), 1 << 22):
        out[start : start + (1 << 22)] = table[flat[start : start + (1 << 22)].int() + 128]
    if (out == 255).any():
        raise ValueError(f"q has values outside its codebook {codebook}")
    return out.view(q.shape)


def _factors(values: torch.Tensor, parts, half: bool | None, k: int):
    """Block scales or offsets [rows, K/B] in the group layout: (per-block tensor, super-block
    tensor or None). Factored where `parts` (super [rows, K/256], sub [rows, K/B]) is given,
    K is a multiple of 256 and the product is `values` bit for bit: the int8 sub and the float32
    super. NOTE: the check costs one pass over the scales; it keeps a caller that reorders rows
    without reordering the parts (gguf_model.py's q/k rows of a llama file) from changing a
    weight. Else fp16 where `half` (None: where exact), or float32."""
    values = values.float()
    if parts is not None and k % 256 == 0:
        sup, sub = parts[0].float(), parts[1].to(torch.int8)
        if sup.shape == (values.shape[0], k // 256) and sub.shape == values.shape:
            product = sup.repeat_interleave(values.shape[1] // sup.shape[1], 1) * sub.float()
            if torch.equal(product.view(torch.int32), values.view(torch.int32)):
                return _by_group(sub), _by_group(sup)
    as_half = values.half()
    if half is None:
        half = torch.equal(as_half.float(), values)
    return _by_group(as_half if half else values), None


def _stored_range(bits: int, zero: int) -> tuple[int, int]:
    """The q a width and zero point hold (a value_range that packs into that width again)."""
    return (-128, 127) if bits == 8 else (-zero, (1 << bits) - 1 - zero)


_FACTS = ("rows", "cols", "group", "bits", "zero")


def _checked_codebook(facts: dict, factored: bool) -> torch.Tensor | None:
    """The codebook of a stored part's layout facts (None: none). ValueError unless the facts
    are a layout the kernels run (inferd_block_gemv's checks)."""
    if set(facts) - {*_FACTS, "codebook"} or not all(type(facts.get(f)) is int for f in _FACTS):
        raise ValueError(f"not the layout facts of stored blocks: {facts}")
    rows, k, group, bits, zero = (facts[f] for f in _FACTS)
    codebook = facts.get("codebook")
    fits = (rows >= 0 and k > 0 and k % 32 == 0 and group in (16, 32) and k % group == 0
            and bits in (4, 5, 6, 8) and (not factored or k % 256 == 0))  # fmt: skip
    if codebook is not None:
        fits = (fits and bits == 4 and zero == 0 and isinstance(codebook, list)
                and len(codebook) == 16
                and all(type(v) is int and -128 <= v < 128 for v in codebook))  # fmt: skip
    if not fits:
        raise ValueError(f"stored blocks of an unsupported layout: {facts}")
    return None if codebook is None else torch.tensor(codebook, dtype=torch.int8)


def _stored_tensors(part: BlockPart, names) -> dict[str, tuple[int, tuple[torch.dtype, ...]]]:
    """Per tensor of a part of this layout: its elements per group, the dtypes it may have
    (`names`: the tensors it has, which say whether its scales and offsets are factored)."""
    k, blocks, supers = part.shape[1], part.shape[1] // part.group, part.shape[1] // 256
    factors = (torch.uint8, torch.int8)
    expected = {
        "q": (GROUP * k // (1 if part.bits == 8 else 2), (torch.uint8,)),
        "scale": (blocks * GROUP,
                  factors if "scale_super" in names else (torch.float16, torch.float32)),
        "offset": (blocks * GROUP, factors if "offset_super" in names else (torch.float32,)),
        "scale_super": (supers * GROUP, (torch.float32,)),
        "offset_super": (supers * GROUP, (torch.float32,)),
    }  # fmt: skip
    if part.bits in (5, 6):
        expected["high"] = ((2 if part.bits == 5 else 4) * k, (torch.uint8,))
    return expected


class BlockPart:
    """Rows of a weight in one storage layout (see block_gemv.c): 8 bits, q itself; 4, 5 and 6
    bits, `stored` = q + zero; or 4-bit indexes into `codebook` (zero 0). Scales fp16 or fp32,
    or factored: `scale` int8 and `scale_super` float32 (offsets likewise). Tensors in the
    kernels' group layout (block_layout.h)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None,
                 value_range: tuple[int, int] | None = None,
                 half_scales: bool | None = None, codebook: tuple[int, ...] | None = None,
                 scale_parts=None, offset_parts=None):  # fmt: skip
        """q, scale, offset and the storage facts of a BlockValues."""
        rows, k = q.shape
        q = q.to(torch.int8)  # every GGUF type's integers fit
        self.group = k // scale.shape[1]
        if self.group not in (16, 32) or k % 32 or k != self.group * scale.shape[1]:
            raise ValueError(f"unsupported block layout: {k} inputs, {scale.shape[1]} blocks")
        if codebook is not None:
            if not 1 <= len(codebook) <= 16 or not all(-128 <= v < 128 for v in codebook):
                raise ValueError(f"a codebook holds 1 to 16 int8 values, not {codebook}")
            self.bits, self.zero = 4, 0
            self.codebook = torch.tensor([*codebook, *[0] * (16 - len(codebook))], dtype=torch.int8)
            stored = _codebook_indexes(q, codebook)
        else:
            lo, hi = value_range if value_range is not None else (int(q.min()), int(q.max()))
            self.bits = 8 if hi - lo >= 64 else 6 if hi - lo >= 32 else 5 if hi - lo >= 16 else 4
            self.zero = 0 if self.bits == 8 else -lo
            self.codebook = None
            # q + zero is in 0 .. 63 (the type's range): exact in int8, with no int16 copies of
            # a range of rows (2 bytes a weight each) while a first load unpacks it
            stored = None if self.bits == 8 else (q + self.zero).view(torch.uint8)
        self.high = None
        if stored is None:
            self.q = _units(_grouped(q)).contiguous().view(torch.uint8).flatten(1)
        else:
            stored = _grouped(stored)
            self.q = _pack_nibbles(stored, self.group)
            if self.bits == 5:
                self.high = _pack_bits(_units(stored >> 4).flatten(2)).flatten(1)
            elif self.bits == 6:
                self.high = _pack_high2(stored, self.group)
        self.scale, self.scale_super = _factors(scale, scale_parts, half_scales, k)
        self.offset, self.offset_super = (None, None) if offset is None else _factors(
            offset, offset_parts, False, k)  # fmt: skip
        self.shape = (rows, k)
        self._describe()

    def _describe(self) -> None:
        """The C view of this part (pointers into its tensors)."""
        rows, k = self.shape

        def ptr(t: torch.Tensor | None) -> int | None:
            return None if t is None else t.data_ptr()

        self.struct = BlockMatrix(
            ptr(self.q), ptr(self.high), ptr(self.scale), ptr(self.offset), rows, k, self.group,
            self.bits, self.zero, int(self.scale.dtype == torch.float16), ptr(self.scale_super),
            ptr(self.offset_super), ptr(self.codebook),
        )  # fmt: skip

    def stored(self) -> tuple[dict[str, torch.Tensor], dict]:
        """The tensors and the layout facts that rebuild this part (gguf_cache.py). int8
        factors as uint8 (the cache's tensor types)."""
        tensors = {"q": self.q, "high": self.high, "scale": self.scale, "offset": self.offset,
                   "scale_super": self.scale_super, "offset_super": self.offset_super}  # fmt: skip
        tensors = {k: v.view(torch.uint8) if v is not None and v.dtype == torch.int8 else v
                   for k, v in tensors.items()}  # fmt: skip
        facts = dict(rows=self.shape[0], cols=self.shape[1], group=self.group, bits=self.bits,
                     zero=self.zero)  # fmt: skip
        if self.codebook is not None:
            facts["codebook"] = self.codebook.tolist()
        return {k: v for k, v in tensors.items() if v is not None}, facts

    @classmethod
    def restored(cls, tensors: dict[str, torch.Tensor], facts: dict) -> BlockPart:
        """The part `stored` described, from its tensors as they are (no packing). Raises
        ValueError where the facts are not a layout the kernels run or the tensors do not have
        the sizes and types they imply (a cache entry is an untrusted file: the kernels read
        as many bytes as the facts say)."""
        part = cls.__new__(cls)
        part.codebook = _checked_codebook(facts, "scale_super" in tensors or
                                          "offset_super" in tensors)  # fmt: skip
        part.shape = (facts["rows"], facts["cols"])
        part.group, part.bits, part.zero = facts["group"], facts["bits"], facts["zero"]
        expected = _stored_tensors(part, tensors.keys())
        groups = -(-part.shape[0] // GROUP)
        needed = {"q", "scale"} | ({"high"} & expected.keys())
        if "offset_super" in tensors:
            needed.add("offset")
        if not (needed <= tensors.keys() <= expected.keys()) or not all(
            t.numel() == groups * expected[key][0] and t.dtype in expected[key][1]
            and t.is_contiguous() for key, t in tensors.items()
        ):  # fmt: skip
            raise ValueError(f"stored blocks do not have the sizes of {facts}")

        def signed(t: torch.Tensor | None, sup: torch.Tensor | None) -> torch.Tensor | None:
            return t if t is None or sup is None else t.view(torch.int8)  # factors: int8

        part.q, part.high = tensors["q"], tensors.get("high")
        part.scale_super = tensors.get("scale_super")
        part.offset_super = tensors.get("offset_super")
        part.scale = signed(tensors["scale"], part.scale_super)
        part.offset = signed(tensors.get("offset"), part.offset_super)
        part._describe()
        return part

    def _index(self, rows) -> tuple[torch.Tensor, torch.Tensor]:
        """Group and row within it of `rows` (an index tensor or a slice)."""
        if isinstance(rows, slice):
            rows = torch.arange(*rows.indices(self.shape[0]))
        rows = torch.as_tensor(rows, dtype=torch.int64)
        return rows // GROUP, rows % GROUP

    def _stored(self, g: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """The stored values of rows (g, r), [n, K]: 8 bits, q as int8; else q + zero (or the
        codebook index), uint8. Reads only those rows' bytes (an embedding lookup of a few ids)."""
        groups, k, n = self.q.shape[0], self.shape[1], g.shape[0]
        if self.bits == 8:
            return self.q.view(torch.int8).view(groups, k // 2, GROUP, 2)[g, :, r].reshape(n, k)
        nibbles = self.q.view(groups, -1, GROUP, 2)[g, :, r]  # [n, K/4 chunks, 2]
        stored = _unpack_nibbles(nibbles.reshape(n, -1), self.group, k)
        if self.bits == 5:  # per unit 4 bytes, bit 2r + i: row r's two in byte r // 4
            byte = self.high.view(groups, k // 2, 4)[g, :, r // 4]  # [n, K/2]
            two = (byte >> (2 * (r % 4)).to(torch.uint8)[:, None]) & 3
            stored = stored | (torch.stack([two & 1, two >> 1], -1).reshape(n, k) << 4)
        if self.bits == 6:
            high = self.high.view(groups, k // 8, GROUP, 2)[g, :, r]  # [n, K/8, 2]
            stored = stored | (_unpack_high2(high, self.group, k) << 4)
        return stored

    def _all_stored(self) -> torch.Tensor:
        """The stored values of every row, [N, K], the layout undone by views (no gathers)."""
        groups, k, n = self.q.shape[0], self.shape[1], self.shape[0]
        if self.bits == 8:
            grouped = self.q.view(torch.int8).view(groups, k // 2, GROUP, 2).transpose(1, 2)
            return grouped.reshape(groups * GROUP, k)[:n]
        chunks = self.q.view(groups, -1, GROUP, 2).transpose(1, 2)  # [G, 16, K/4, 2]
        stored = _unpack_nibbles(chunks.reshape(groups * GROUP, -1), self.group, k)
        if self.bits == 5:
            bits = (self.high.view(groups, k // 2, 4, 1) >> torch.arange(8, dtype=torch.uint8)) & 1
            fifth = bits.view(groups, k // 2, GROUP, 2).transpose(1, 2).reshape(groups * GROUP, k)
            stored = stored | (fifth << 4)
        if self.bits == 6:
            high = self.high.view(groups, k // 8, GROUP, 2).transpose(1, 2)  # [G, 16, K/8, 2]
            stored = stored | (_unpack_high2(high.reshape(groups * GROUP, k // 8, 2), self.group,
                                             k) << 4)  # fmt: skip
        return stored[:n]

    def _integers(self, stored: torch.Tensor) -> torch.Tensor:
        """q as int16 from stored values: the zero point removed, or looked up."""
        if self.codebook is not None:
            return self.codebook[stored.int()].to(torch.int16)
        return stored.to(torch.int16) - self.zero

    def integers(self, rows=slice(None)) -> torch.Tensor:
        """q of `rows` (an index tensor or a slice), as int16 [len(rows), K]."""
        if isinstance(rows, slice) and rows == slice(None):
            return self._integers(self._all_stored())
        return self._integers(self._stored(*self._index(rows)))

    def _per_block(self, values: torch.Tensor, sup: torch.Tensor | None, g, r) -> torch.Tensor:
        """Block scales or offsets of rows (g, r) as float32 [n, K/B]; factored, super * sub:
        exact, so the same floats."""
        per_block = values[g, :, r].float()
        if sup is None:
            return per_block
        return sup[g, :, r].repeat_interleave(256 // self.group, 1) * per_block

    def dequantized(self, rows=slice(None)) -> torch.Tensor:
        """float32, bit-identical to the GGUF dequantisation: scale * q (+ offset), q exact."""
        g, r = self._index(rows)
        n, k = g.shape[0], self.shape[1]
        q = self._integers(self._stored(g, r)).float()  # small integers: exact
        scale = self._per_block(self.scale, self.scale_super, g, r)
        w = q.view(n, k // self.group, self.group) * scale[..., None]
        if self.offset is not None:
            w += self._per_block(self.offset, self.offset_super, g, r)[..., None]
        return w.view(n, k)

    def block_scales(self) -> torch.Tensor:
        """The block scales [N, K/B] as float32 (for `stack`)."""
        return self._per_block(self.scale, self.scale_super, *self._index(slice(None)))

    def block_offsets(self) -> torch.Tensor | None:
        if self.offset is None:
            return None
        return self._per_block(self.offset, self.offset_super, *self._index(slice(None)))

    def values(self) -> BlockValues:
        """The BlockValues that pack into this part's layout again (to join it with others)."""
        g, r = self._index(slice(None))

        def parts(per_block, sup):
            return None if sup is None else (sup[g, :, r], per_block[g, :, r])

        codebook = None if self.codebook is None else tuple(self.codebook.tolist())
        return BlockValues(self.integers(), self.block_scales(), self.block_offsets(),
                           _stored_range(self.bits, self.zero), self.scale.dtype == torch.float16,
                           codebook, parts(self.scale, self.scale_super),
                           parts(self.offset, self.offset_super))  # fmt: skip

    def layout(self) -> tuple:
        """What two parts must share to be joined into one."""
        codebook = None if self.codebook is None else tuple(self.codebook.tolist())
        return (self.bits, self.zero, self.group, self.scale.dtype, self.offset is None,
                self.scale_super is None, self.offset_super is None, codebook)  # fmt: skip

    def summary(self) -> str:
        """e.g. '640 rows 6-bit/16 (factored scales)'."""
        kind = "4-bit codes" if self.codebook is not None else f"{self.bits}-bit"
        supers = {"scales": self.scale_super, "offsets": self.offset_super}
        factored = [what for what, sup in supers.items() if sup is not None]
        extra = f" (factored {' and '.join(factored)})" if factored else ""
        return f"{self.shape[0]} rows {kind}/{self.group}{extra}"

    @property
    def nbytes(self) -> int:
        tensors = [self.q, self.high, self.scale, self.offset, self.scale_super,
                   self.offset_super, self.codebook]  # fmt: skip
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class BlockWeight(nn.Module):
    """A linear layer's weight as one or more `BlockPart`s stacked along the output."""

    def __init__(self, q: torch.Tensor | None = None, scale: torch.Tensor | None = None,
                 offset: torch.Tensor | None = None, value_range: tuple[int, int] | None = None,
                 half_scales: bool | None = None, codebook: tuple[int, ...] | None = None,
                 scale_parts=None, offset_parts=None,
                 parts: list[BlockPart] | None = None):  # fmt: skip
        super().__init__()
        if parts is None:
            parts = [BlockPart(q, scale, offset, value_range, half_scales, codebook, scale_parts,
                               offset_parts)]  # fmt: skip
        self.parts = parts
        self.lib = None  # the C kernels, looked up at the first product
        for i, p in enumerate(self.parts):  # so that module-level size accounting sees them
            self.register_buffer(f"part{i}_q", p.q, persistent=False)

    @property
    def shape(self) -> tuple[int, int]:
        return sum(p.shape[0] for p in self.parts), self.parts[0].shape[1]

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def dequantized(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The float32 weights (of `rows`), bit-identical to the GGUF dequantisation."""
        if rows is None:
            return torch.cat([p.dequantized() for p in self.parts])
        if len(self.parts) != 1:
            raise ValueError("row lookups are for single-part weights (embeddings)")
        part = self.parts[0]
        ids = rows.tolist() if rows.dim() == 1 and rows.numel() <= FEW_ROWS else None
        if ids and all(0 <= i < part.shape[0] for i in ids):
            from inferd.cpu_kernels import KernelsUnavailable

            try:
                lib = self._kernels()
            except KernelsUnavailable:
                return part.dequantized(rows)
            # NOTE: the C kernel does the same float operations (block_gemv.c), one call a row:
            # a decode step's lookup of one id ~40 us, against ~75 us of tensor ops
            out = torch.empty(len(ids), part.shape[1])
            for j, i in enumerate(ids):
                lib.inferd_block_dequantize(ctypes.byref(part.struct), i, 1, 0, out[j].data_ptr())
            return out
        return part.dequantized(rows)

    def _kernels(self):
        if self.lib is None:
            from inferd.cpu_kernels import kernel_library

            self.lib = kernel_library()
        return self.lib

    def dense(self, dtype: torch.dtype, rows: slice = slice(None)) -> torch.Tensor:
        """The weights (output rows `rows`, a slice with step 1) in `dtype`, dequantised by the
        C kernel (float32 or bfloat16 directly)."""
        lib = self._kernels()
        start, stop, _ = rows.indices(self.shape[0])
        direct = dtype if dtype == torch.bfloat16 else torch.float32
        out = torch.empty(max(stop - start, 0), self.shape[1], dtype=direct)
        first = 0
        for p in self.parts:
            lo, hi = max(start, first), min(stop, first + p.shape[0])  # this part's share
            if lo < hi:
                lib.inferd_block_dequantize(ctypes.byref(p.struct), lo - first, hi - lo,
                                            int(direct == torch.bfloat16),
                                            out[lo - start].data_ptr())  # fmt: skip
            first += p.shape[0]
        return out.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, in] → float32 [rows, out], by the C block kernel (any rows; it is the fast
        choice for a few)."""
        self._kernels()
        x = x.float().contiguous()
        out_features = self.shape[0]
        y = torch.empty(x.shape[0], out_features, dtype=torch.float32)
        first = 0
        for p in self.parts:
            rc = self.lib.inferd_block_gemv(x.data_ptr(), x.shape[0], ctypes.byref(p.struct),
                                            y.data_ptr() + 4 * first, out_features)  # fmt: skip
            if rc != 0:
                raise RuntimeError(f"block_gemv failed ({rc}) on a {tuple(x.shape)} input")
            first += p.shape[0]
        return y

    def extra_repr(self) -> str:
        out_features, in_features = self.shape
        layouts = ", ".join(p.summary() for p in self.parts)
        return f"out={out_features}, in={in_features}: {layouts}"


def stack(weights: list[BlockWeight]) -> BlockWeight:
    """One BlockWeight from several along the output (q/k/v, gate/up). Neighbouring parts of the
    same layout are merged, so most layers need one kernel call."""
    parts: list[BlockPart] = []
    for p in [p for w in weights for p in w.parts]:
        last = parts[-1] if parts else None
        if last is not None and _same_layout(last, p):
            parts[-1] = _joined(last, p)
        else:
            parts.append(p)
    return BlockWeight(parts=parts)


def _joined(a: BlockPart, b: BlockPart) -> BlockPart:
    """a's rows then b's, in one part of their (common) layout."""
    if a.shape[0] % GROUP == 0:  # whole groups: the packed tensors follow each other
        tensors, facts = a.stored()
        tensors = {key: torch.cat([t, b.stored()[0][key]]) for key, t in tensors.items()}
        return BlockPart.restored(tensors, {**facts, "rows": a.shape[0] + b.shape[0]})
    va, vb = a.values(), b.values()

    def cat(x, y):
        if x is None or isinstance(x, torch.Tensor):
            return None if x is None else torch.cat([x, y])
        return tuple(cat(i, j) for i, j in zip(x, y))  # factored parts

    return BlockPart(*[cat(x, y) for x, y in zip(va[:3], vb[:3])], *va[3:6],
                     *[cat(x, y) for x, y in zip(va[6:], vb[6:])])  # fmt: skip


def _same_layout(a: BlockPart, b: BlockPart) -> bool:
    return a.layout() == b.layout()


def packed(load: Callable[[int, int], BlockValues | None], rows: int, cols: int,
           padded_rows: int | None = None) -> BlockWeight | None:  # fmt: skip
    """A [rows, cols] matrix packed from `load(first, count)` (its blocks for those rows, or
    None when it has none), a range of rows at a time where it is large, so that the unpacked
    values of only one range exist at once (`CHUNK_WEIGHTS`); zero rows up to `padded_rows`
    (a vocabulary shard's padding). None when the matrix has no blocks."""
    total = padded_rows or rows
    step = rows if rows * cols <= CHUNK_WEIGHTS else CHUNK_ROWS
    builder, start = None, 0
    while True:
        count = min(rows - start, step)
        values = load(start, count)
        if values is None:
            return None
        last = start + count == rows
        if last and total > rows:
            values = _with_zero_rows(values, total - rows)
        if builder is None and last:
            return BlockWeight(*values)  # one range: nothing to join
        builder = builder or _PartBuilder(total)
        builder.add(start, BlockPart(*values))
        if last:
            return BlockWeight(parts=[builder.part()])
        start += count


def _with_zero_rows(values: BlockValues, count: int) -> BlockValues:
    def padded(t: torch.Tensor | None, fill: int = 0) -> torch.Tensor | None:
        return None if t is None else torch.cat([t, t.new_full((count, t.shape[1]), fill)])

    def padded_parts(parts):
        return None if parts is None else tuple(padded(t) for t in parts)

    # scale 0 (offset 0) makes a zero row; its q must still be a codebook value
    fill = values.codebook[0] if values.codebook else 0
    return values._replace(q=padded(values.q, fill), scale=padded(values.scale),
                           offset=padded(values.offset),
                           scale_parts=padded_parts(values.scale_parts),
                           offset_parts=padded_parts(values.offset_parts))  # fmt: skip


class _PartBuilder:
    """One BlockPart of `rows` rows, filled from parts of consecutive rows of the same layout,
    each (but the last) a whole number of groups: their packed tensors are copied into place,
    one part at a time."""

    def __init__(self, rows: int):
        self.rows = rows
        self.tensors: dict[str, torch.Tensor] = {}
        self.facts: dict = {}

    def add(self, first_row: int, part: BlockPart) -> None:
        if first_row % GROUP:
            raise ValueError("parts join at whole groups of rows only")
        stored, facts = part.stored()
        if not self.tensors:
            groups = -(-self.rows // GROUP)
            self.tensors = {k: t.new_empty((groups, *t.shape[1:])) for k, t in stored.items()}
            self.facts = {**facts, "rows": self.rows}
        elif {k: v for k, v in facts.items() if k != "rows"} != {
            k: v for k, v in self.facts.items() if k != "rows"
        } or stored.keys() != self.tensors.keys():
            raise ValueError(f"a range of rows is stored as {facts}, the first as {self.facts}")
        g = first_row // GROUP
        for key, t in stored.items():
            if t.dtype != self.tensors[key].dtype:
                raise ValueError(f"a range of rows has {key} in {t.dtype}")
            self.tensors[key][g : g + t.shape[0]] = t

    def part(self) -> BlockPart:
        return BlockPart.restored(self.tensors, self.facts)

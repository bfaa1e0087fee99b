"""A GGUF file's own block quantisation, kept as it is, and the C kernels that multiply by it.

Every GGUF type (Q4_0 … Q8_0, Q2_K … Q6_K) is, per sub-block of B = 32 (or 16) weights along the
input, `w = scale * q + offset` with small integers q. A `BlockWeight` holds exactly that, so no
weight changes value (unlike re-quantising a dequantised matrix to int8 or int4, which rounds
weights that were already rounded once). q is stored in 4, 5 or 8 bits, whichever its range
needs, and scales in fp16 where that is exact, so a token reads about as many bytes as the GGUF
file holds.

The layout is the kernels' (cpu_kernels/block_gemv.c, byte offsets in block_layout.h): output
rows in groups of 16 (the last padded with zero rows), and per group, for each pair of inputs
(a "unit"), the 16 rows' two weights side by side, so that one vector lane per output row
multiplies a broadcast pair of activations; 4-bit (and 5-bit) units two to a 32-byte chunk, in
the low and high nibbles; the 5-bit layout's fifth bits one 32-bit word per unit; block scales
and offsets [groups, K/B, 16]. `integers` and `dequantized` read it back (a few rows, e.g. an
embedding lookup, without unpacking the rest).

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
                ("B", _I), ("bits", _I), ("zero", _I), ("half_scales", _I)]  # fmt: skip


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
    """[G, 16, K] values < 16 → [G, 8 K] bytes: per block, chunk c (32 bytes, byte 2r + i) holds
    unit c of the block in its low nibbles and unit c + B/4 in its high ones."""
    g, _, k = stored.shape
    v = stored.view(g, GROUP, k // block, 2, block // 4, 2)  # [g, r, b, nibble, c, i]
    v = v.permute(0, 2, 4, 1, 5, 3)  # [g, b, c, r, i, nibble]
    return (v[..., 0] | (v[..., 1] << 4)).reshape(g, -1)


def _unpack_nibbles(packed: torch.Tensor, block: int, k: int) -> torch.Tensor:
    """One row's bytes of each chunk, [n, K/2] ordered [b, c, i] → its values [n, K]."""
    n = packed.shape[0]
    v = packed.view(n, k // block, 1, block // 4, 2)
    return torch.cat([v & 0xF, v >> 4], dim=2).reshape(n, k)


def _pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """[..., 8 j] of 0/1 → [..., j] bytes, bit i of byte j = element 8j + i."""
    weights = 1 << torch.arange(8, dtype=torch.uint8)
    return (bits.reshape(*bits.shape[:-1], -1, 8) * weights).sum(-1, dtype=torch.uint8)


class BlockPart:
    """Rows of a weight in one storage width (see block_gemv.c): 8 bits, q itself; 4 and 5
    bits, `stored` = q + zero. Tensors in the kernels' group layout (block_layout.h)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None,
                 value_range: tuple[int, int] | None = None,
                 half_scales: bool | None = None, codebook: tuple[int, ...] | None = None,
                 scale_parts=None, offset_parts=None):  # fmt: skip
        """q, scale, offset and the storage facts of a BlockValues (codebook and the factored
        scales: not used yet, q and the scales are stored themselves)."""
        rows, k = q.shape
        q = q.to(torch.int8)  # every GGUF type's integers fit
        self.group = k // scale.shape[1]
        if self.group not in (16, 32) or k % 32 or k != self.group * scale.shape[1]:
            raise ValueError(f"unsupported block layout: {k} inputs, {scale.shape[1]} blocks")
        lo, hi = value_range if value_range is not None else (int(q.min()), int(q.max()))
        self.bits = 8 if hi - lo >= 32 else 4 if hi - lo < 16 else 5
        self.zero = 0 if self.bits == 8 else -lo
        self.high = None
        if self.bits == 8:
            self.q = _units(_grouped(q)).contiguous().view(torch.uint8).flatten(1)
        else:
            stored = _grouped((q.to(torch.int16) + self.zero).to(torch.uint8))
            self.q = _pack_nibbles(stored & 0xF, self.group)
            if self.bits == 5:
                self.high = _pack_bits(_units(stored >> 4).flatten(2)).flatten(1)
        scale = scale.float()
        half = scale.half()
        if half_scales is None:
            half_scales = torch.equal(half.float(), scale)
        self.scale = _by_group(half if half_scales else scale)
        self.offset = None if offset is None else _by_group(offset.float())
        self.shape = (rows, k)
        self._describe()

    def _describe(self) -> None:
        """The C view of this part (pointers into its tensors)."""
        rows, k = self.shape
        self.struct = BlockMatrix(
            self.q.data_ptr(), None if self.high is None else self.high.data_ptr(),
            self.scale.data_ptr(), None if self.offset is None else self.offset.data_ptr(),
            rows, k, self.group, self.bits, self.zero, int(self.scale.dtype == torch.float16),
        )  # fmt: skip

    def stored(self) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
        """The tensors and the layout facts that rebuild this part (gguf_cache.py)."""
        tensors = {"q": self.q, "scale": self.scale, "high": self.high, "offset": self.offset}
        facts = dict(rows=self.shape[0], cols=self.shape[1], group=self.group, bits=self.bits,
                     zero=self.zero)  # fmt: skip
        return {k: v for k, v in tensors.items() if v is not None}, facts

    @classmethod
    def restored(cls, tensors: dict[str, torch.Tensor], facts: dict[str, int]) -> BlockPart:
        """The part `stored` described, from its tensors as they are (no packing). Raises
        ValueError where they do not have the sizes the facts imply."""
        part = cls.__new__(cls)
        part.q, part.scale = tensors["q"], tensors["scale"]
        part.high, part.offset = tensors.get("high"), tensors.get("offset")
        part.shape = (facts["rows"], facts["cols"])
        part.group, part.bits, part.zero = facts["group"], facts["bits"], facts["zero"]
        groups, k = -(-part.shape[0] // GROUP), part.shape[1]
        blocks = k // part.group
        per_group = {"q": GROUP * k // (1 if part.bits == 8 else 2), "scale": blocks * GROUP,
                     "high": 2 * k, "offset": blocks * GROUP}  # fmt: skip
        sizes_fit = all(t.numel() == groups * per_group[key] for key, t in tensors.items())
        if not sizes_fit or (part.bits == 5) != (part.high is not None):
            raise ValueError(f"stored blocks do not have the sizes of {facts}")
        part._describe()
        return part

    def _index(self, rows) -> tuple[torch.Tensor, torch.Tensor]:
        """Group and row within it of `rows` (an index tensor or a slice)."""
        if isinstance(rows, slice):
            rows = torch.arange(*rows.indices(self.shape[0]))
        rows = torch.as_tensor(rows, dtype=torch.int64)
        return rows // GROUP, rows % GROUP

    def _stored(self, g: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """The stored values of rows (g, r), [n, K]: 8 bits, q as int8; else q + zero, uint8.
        Reads only those rows' bytes (an embedding lookup of a few ids)."""
        groups, k, n = self.q.shape[0], self.shape[1], g.shape[0]
        if self.bits == 8:
            return self.q.view(torch.int8).view(groups, k // 2, GROUP, 2)[g, :, r].reshape(n, k)
        nibbles = self.q.view(groups, -1, GROUP, 2)[g, :, r]  # [n, K/4 chunks, 2]
        stored = _unpack_nibbles(nibbles.reshape(n, -1), self.group, k)
        if self.bits == 5:  # per unit 4 bytes, bit 2r + i: row r's two in byte r // 4
            byte = self.high.view(groups, k // 2, 4)[g, :, r // 4]  # [n, K/2]
            two = (byte >> (2 * (r % 4)).to(torch.uint8)[:, None]) & 3
            stored = stored | (torch.stack([two & 1, two >> 1], -1).reshape(n, k) << 4)
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
        return stored[:n]

    def integers(self, rows=slice(None)) -> torch.Tensor:
        """q of `rows` (an index tensor or a slice), as int16 [len(rows), K]."""
        if isinstance(rows, slice) and rows == slice(None):
            return self._all_stored().to(torch.int16) - self.zero
        return self._stored(*self._index(rows)).to(torch.int16) - self.zero

    def _per_block(self, values: torch.Tensor, rows) -> torch.Tensor:
        """Block scales or offsets of `rows`, [len(rows), K/B]."""
        g, r = self._index(rows)
        return values[g, :, r]

    def dequantized(self, rows=slice(None)) -> torch.Tensor:
        """float32, bit-identical to the GGUF dequantisation: scale * q (+ offset), q exact."""
        g, r = self._index(rows)
        n, k = g.shape[0], self.shape[1]
        q = self._stored(g, r).float()
        if self.zero:
            q -= self.zero  # small integers: exact
        w = q.view(n, k // self.group, self.group) * self.scale[g, :, r].float()[..., None]
        if self.offset is not None:
            w += self.offset[g, :, r][..., None]
        return w.view(n, k)

    def block_scales(self) -> torch.Tensor:
        """The block scales [N, K/B] as float32 (for `stack`)."""
        return self._per_block(self.scale, slice(None)).float()

    def block_offsets(self) -> torch.Tensor | None:
        return None if self.offset is None else self._per_block(self.offset, slice(None))

    @property
    def nbytes(self) -> int:
        tensors = [self.q, self.high, self.scale, self.offset]
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
        layouts = ", ".join(f"{p.shape[0]} rows {p.bits}-bit/{p.group}" for p in self.parts)
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
    q = torch.cat([a.integers(), b.integers()])
    scale = torch.cat([a.block_scales(), b.block_scales()])
    offset = None if a.offset is None else torch.cat([a.block_offsets(), b.block_offsets()])
    return BlockPart(q, scale, offset)


def _same_layout(a: BlockPart, b: BlockPart) -> bool:
    return (a.bits, a.zero, a.group, a.scale.dtype, a.offset is None) == (
        b.bits, b.zero, b.group, b.scale.dtype, b.offset is None
    )  # fmt: skip


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
    def padded(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else torch.cat([t, t.new_zeros(count, t.shape[1])])

    return values._replace(q=padded(values.q), scale=padded(values.scale),
                           offset=padded(values.offset))  # fmt: skip


class _PartBuilder:
    """One BlockPart of `rows` rows, filled from parts of consecutive rows of the same layout,
    each (but the last) a whole number of groups: their packed tensors are copied into place,
    one part at a time."""

    def __init__(self, rows: int):
        self.rows = rows
        self.tensors: dict[str, torch.Tensor] = {}
        self.facts: dict[str, int] = {}

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

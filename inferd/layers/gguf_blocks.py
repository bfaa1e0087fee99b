"""A GGUF file's own block quantisation, kept as it is, and the C kernels that multiply by it.

Every GGUF type (Q4_0 … Q8_0, Q2_K … Q6_K) is, per sub-block of B = 32 (or 16) weights along the
input, `w = scale * q + offset` with small integers q. A `BlockWeight` holds exactly that, so no
weight changes value (unlike re-quantising a dequantised matrix to int8 or int4, which rounds
weights that were already rounded once). q is stored in 4, 5 or 8 bits, whichever its range
needs, and scales in fp16 where that is exact, so a token reads about as many bytes as the GGUF
file holds (cpu_kernels/block_gemv.c describes the layouts).

`BlockWeight.forward` is the C kernel, which quantises each activation to two int8 terms per
block of 32 values (16-bit precision: llama.cpp's one int8 term flips a few percent of a small
model's argmaxes) and sums exactly in integers (VNNI where the CPU has it). It wins for steps of
a few rows (bound by reading weights); steps with many rows are bound by arithmetic and go to
PyTorch's GEMM on `dense()` weights instead: `BlockMethod` (block_method.py) picks per step.
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

MAX_PARTS = 4  # row ranges of one layer (q/k/v of different GGUF types): see decode_layer.c

_P, _I = ctypes.c_void_p, ctypes.c_int64


class BlockMatrix(ctypes.Structure):
    """Mirrors the C struct in cpu_kernels/kernels.h."""

    _fields_ = [("q", _P), ("high", _P), ("scale", _P), ("offset", _P), ("N", _I), ("K", _I),
                ("B", _I), ("bits", _I), ("zero", _I), ("half_scales", _I),
                ("interleaved", _I)]  # fmt: skip


def _interleave(rows: torch.Tensor, chunks: int) -> torch.Tensor:
    """[N, chunks * c] → [N/4, chunks, 4, c]: the chunks of rows 4i..4i+3 side by side."""
    n, width = rows.shape
    return rows.view(n // 4, 4, chunks, width // chunks).transpose(1, 2).contiguous()


def _deinterleave(grouped: torch.Tensor, rows) -> torch.Tensor:
    """`rows` (an index tensor or a slice) of an interleaved array, as [len, chunks * c]."""
    groups, chunks, _, c = grouped.shape
    if isinstance(rows, slice):
        return grouped.transpose(1, 2).reshape(groups * 4, chunks * c)[rows]
    return grouped[rows // 4, :, rows % 4, :].reshape(-1, chunks * c)


def _pack_nibbles(stored: torch.Tensor) -> torch.Tensor:
    """[rows, K] values < 16 → [rows, K / 2] bytes: per 64 weights, byte j = w[j] | w[j+32] << 4."""
    rows, k = stored.shape
    halves = stored.view(rows, k // 64, 2, 32)
    return ((halves[:, :, 0] & 0xF) | ((halves[:, :, 1] & 0xF) << 4)).reshape(rows, k // 2)


def _unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    rows, half = packed.shape
    chunks = packed.view(rows, half // 32, 1, 32)
    return torch.cat([chunks & 0xF, chunks >> 4], dim=2).reshape(rows, half * 2)


def _pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """[rows, K] of 0/1 → [rows, K / 8] bytes, bit i of byte j = weight 8j + i."""
    rows, k = bits.shape
    weights = (1 << torch.arange(8, dtype=torch.uint8)).view(1, 1, 8)
    return (bits.view(rows, k // 8, 8) * weights).sum(-1, dtype=torch.uint8)


def _unpack_bits(packed: torch.Tensor) -> torch.Tensor:
    shifts = torch.arange(8, dtype=torch.uint8).view(1, 1, 8)
    return ((packed.unsqueeze(-1) >> shifts) & 1).reshape(packed.shape[0], -1)


class BlockPart:
    """Rows of a weight in one storage width (see block_gemv.c): `stored` = q + zero."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None):
        rows, k = q.shape
        q = q.to(torch.int8)  # every GGUF type's integers fit
        self.group = k // scale.shape[1]
        if self.group not in (16, 32) or k % 32:
            raise ValueError(f"unsupported block layout: {k} inputs, {scale.shape[1]} blocks")
        lo, hi = int(q.min()), int(q.max())
        self.bits = 8
        if k % 64 == 0 and hi - lo < 32:
            self.bits = 4 if hi - lo < 16 else 5
        self.zero = 128 if self.bits == 8 else -lo
        if self.bits == 8:
            stored = q.view(torch.uint8) ^ 128  # q + 128 in a byte: the sign bit flipped
        else:
            stored = (q.to(torch.int16) + self.zero).to(torch.uint8)
        self.high = None
        if self.bits == 8:
            self.q = stored.contiguous()
        else:
            self.q = _pack_nibbles(stored)
            if self.bits == 5:
                self.high = _pack_bits(stored >> 4)
        self.interleaved = rows % 4 == 0 and k % 64 == 0
        if self.interleaved:
            self.q = _interleave(self.q, k // 64)
            self.high = None if self.high is None else _interleave(self.high, k // 64)
        scale = scale.float()
        half = scale.half()
        self.scale = half if torch.equal(half.float(), scale) else scale.contiguous()
        self.offset = None if offset is None else offset.float().contiguous()
        self.shape = (rows, k)
        self._describe()

    def _describe(self) -> None:
        """The C view of this part (pointers into its tensors)."""
        rows, k = self.shape
        self.struct = BlockMatrix(
            self.q.data_ptr(), None if self.high is None else self.high.data_ptr(),
            self.scale.data_ptr(), None if self.offset is None else self.offset.data_ptr(),
            rows, k, self.group, self.bits, self.zero, int(self.scale.dtype == torch.float16),
            int(self.interleaved),
        )  # fmt: skip

    def stored(self) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
        """The tensors and the layout facts that rebuild this part (gguf_cache.py)."""
        tensors = {"q": self.q, "scale": self.scale, "high": self.high, "offset": self.offset}
        facts = dict(rows=self.shape[0], cols=self.shape[1], group=self.group, bits=self.bits,
                     zero=self.zero, interleaved=int(self.interleaved))  # fmt: skip
        return {k: v for k, v in tensors.items() if v is not None}, facts

    @classmethod
    def restored(cls, tensors: dict[str, torch.Tensor], facts: dict[str, int]) -> BlockPart:
        """The part `stored` described, from its tensors as they are (no packing)."""
        part = cls.__new__(cls)
        part.q, part.scale = tensors["q"], tensors["scale"]
        part.high, part.offset = tensors.get("high"), tensors.get("offset")
        part.shape = (facts["rows"], facts["cols"])
        part.group, part.bits, part.zero = facts["group"], facts["bits"], facts["zero"]
        part.interleaved = bool(facts["interleaved"])
        part._describe()
        return part

    def _rows(self, packed: torch.Tensor, rows) -> torch.Tensor:
        return _deinterleave(packed, rows) if self.interleaved else packed[rows]

    def integers(self, rows=slice(None)) -> torch.Tensor:
        """q of `rows`, as int16."""
        if self.bits == 8:
            stored = self._rows(self.q, rows)
        else:
            stored = _unpack_nibbles(self._rows(self.q, rows))
            if self.bits == 5:
                stored = stored | (_unpack_bits(self._rows(self.high, rows)) << 4)
        return stored.to(torch.int16) - self.zero

    def dequantized(self, rows=slice(None)) -> torch.Tensor:
        """float32, bit-identical to the GGUF dequantisation: scale * q (+ offset)."""
        w = self.scale[rows].float().repeat_interleave(self.group, 1) * self.integers(rows).float()
        if self.offset is not None:
            w = w + self.offset[rows].repeat_interleave(self.group, 1)
        return w

    @property
    def nbytes(self) -> int:
        tensors = [self.q, self.high, self.scale, self.offset]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class BlockWeight(nn.Module):
    """A linear layer's weight as one or more `BlockPart`s stacked along the output."""

    def __init__(self, q: torch.Tensor | None = None, scale: torch.Tensor | None = None,
                 offset: torch.Tensor | None = None,
                 parts: list[BlockPart] | None = None):  # fmt: skip
        super().__init__()
        self.parts = parts if parts is not None else [BlockPart(q, scale, offset)]
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
        return self.parts[0].dequantized(rows)

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
            q = torch.cat([last.integers(), p.integers()])
            scale = torch.cat([last.scale.float(), p.scale.float()])
            offset = None if p.offset is None else torch.cat([last.offset, p.offset])
            parts[-1] = BlockPart(q, scale, offset)
        else:
            parts.append(p)
    return BlockWeight(parts=parts)


def _same_layout(a: BlockPart, b: BlockPart) -> bool:
    return (a.bits, a.zero, a.group, a.scale.dtype, a.offset is None) == (
        b.bits, b.zero, b.group, b.scale.dtype, b.offset is None
    )  # fmt: skip

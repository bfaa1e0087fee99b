"""GGML tensor types: their block layouts and vectorised dequantisation to float32 in torch.

Each quantised type packs a fixed number of weights (32, or 256 for the "K" types) into a block
of bytes holding small integers plus one or more fp16 scales. Dequantisation turns the blocks of a
tensor into a [n_blocks, block_size] float32 matrix in a few whole-tensor operations; the order
of the floating-point operations follows the reference dequantisers of the `gguf` package, so the
weights come out bit-identical to what HF transformers loads from the same file.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np
import torch

from inferd.errors import ModelLoadError
from inferd.layers.gguf_blocks import BlockValues
from inferd.loader import gguf_iquants

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16 = 10, 11, 12, 13, 14, 30

# ggml type → (weights per block, bytes per block)
BLOCK_LAYOUT: dict[int, tuple[int, int]] = {
    F32: (1, 4), F16: (1, 2), BF16: (1, 2),
    Q4_0: (32, 18), Q4_1: (32, 20), Q5_0: (32, 22), Q5_1: (32, 24), Q8_0: (32, 34),
    Q2_K: (256, 84), Q3_K: (256, 110), Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210),
}  # fmt: skip

TYPE_NAMES = {
    F32: "F32", F16: "F16", BF16: "BF16", Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0",
    Q5_1: "Q5_1", Q8_0: "Q8_0", Q2_K: "Q2_K", Q3_K: "Q3_K", Q4_K: "Q4_K", Q5_K: "Q5_K",
    Q6_K: "Q6_K",
}  # fmt: skip


# Bits per weight of each GGUF type as inferd's blocks hold it (inferd/layers/gguf_blocks.py):
# q in 4, 5, 6 or 8 bits (whichever its type's range needs: Q2_K's and Q3_K's in 4), per
# sub-block of 32 (16 for Q2_K, Q3_K, Q6_K) a scale, and an offset for the types with one: fp16
# for the *_0 and *_1 types; the K-quants' factored as the file has them, an int8 per sub-block
# and a float32 per 256 weights (Q4_K: 4 + 2 x (8/32 + 32/256) = 4.75). Exact for the embedded
# model (tests/parity/test_memory_counts.py).
PACKED_BITS: dict[str, float] = {
    "Q4_0": 4.5, "Q4_1": 5.5, "Q5_0": 5.5, "Q5_1": 6.5, "Q8_0": 8.5,
    "Q2_K": 5.25, "Q3_K": 4.625, "Q4_K": 4.75, "Q5_K": 5.75, "Q6_K": 6.625,
}  # fmt: skip


def type_name(ggml_type: int) -> str:
    return TYPE_NAMES.get(ggml_type, f"ggml type {ggml_type}")


def bits_per_weight(ggml_type: int) -> float:
    block, nbytes = BLOCK_LAYOUT[ggml_type]
    return nbytes * 8 / block


def tensor_nbytes(ggml_type: int, shape: tuple[int, ...], name: str = "") -> int:
    if ggml_type not in BLOCK_LAYOUT:
        raise ModelLoadError(
            f"tensor {name!r} uses {type_name(ggml_type)}, which inferd cannot dequantise; "
            f"supported: {', '.join(sorted(TYPE_NAMES.values()))}"
        )
    block, nbytes = BLOCK_LAYOUT[ggml_type]
    n = math.prod(shape)
    if n % block:
        raise ModelLoadError(f"tensor {name!r}: {n} weights is not a whole number of blocks")
    return n // block * nbytes


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 at byte `start` of every block, as a float32 column."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[n, k] bytes → [n, 2k]: all low nibbles first, then all high nibbles (ggml's order)."""
    return torch.cat([packed & 0xF, packed >> 4], dim=1)


def _bits(packed: torch.Tensor, count: int) -> torch.Tensor:
    """[n, k] bytes → [n, count, k]: bit i of every byte in row i."""
    shifts = torch.arange(count, dtype=torch.uint8).view(1, count, 1)
    return (packed.unsqueeze(1) >> shifts) & 1


def _q5_high_bits(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The 32 fifth bits of a Q5_0/Q5_1 block, stored as one little-endian uint32."""
    qh = blocks[:, start : start + 4].contiguous().view(torch.int32)
    return ((qh >> torch.arange(32, dtype=torch.int32)) & 1).to(torch.uint8)


# Each unpacker turns [n, bytes] blocks into (q, scale, offset): small integers q [n, S, B] (S
# sub-blocks of B weights) and float32 scale (and offset, or None) [n, S, 1], the weights being
# scale * q + offset. Dequantisation applies exactly that; `--quantization gguf` keeps the parts.
Unpacked = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


def _q4_0(b: torch.Tensor) -> Unpacked:
    q = _nibbles(b[:, 2:18]).to(torch.int8) - 8
    return q.view(-1, 1, 32), _f16(b, 0).view(-1, 1, 1), None


def _q4_1(b: torch.Tensor) -> Unpacked:
    q = _nibbles(b[:, 4:20])
    return q.view(-1, 1, 32), _f16(b, 0).view(-1, 1, 1), _f16(b, 2).view(-1, 1, 1)


def _q5_0(b: torch.Tensor) -> Unpacked:
    q = (_nibbles(b[:, 6:22]) | (_q5_high_bits(b, 2) << 4)).to(torch.int8) - 16
    return q.view(-1, 1, 32), _f16(b, 0).view(-1, 1, 1), None


def _q5_1(b: torch.Tensor) -> Unpacked:
    q = _nibbles(b[:, 8:24]) | (_q5_high_bits(b, 4) << 4)
    return q.view(-1, 1, 32), _f16(b, 0).view(-1, 1, 1), _f16(b, 2).view(-1, 1, 1)


def _q8_0(b: torch.Tensor) -> Unpacked:
    return b.view(torch.int8)[:, 2:34].reshape(-1, 1, 32), _f16(b, 0).view(-1, 1, 1), None


def _k_scale_min(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eight 6-bit scales and eight 6-bit mins packed into 12 bytes (Q4_K, Q5_K)."""
    scale = torch.cat([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], dim=1)
    minimum = torch.cat([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], dim=1)
    return scale.float(), minimum.float()


def _k_sub_blocks(qs: torch.Tensor) -> torch.Tensor:
    """128 bytes → [n, 8, 32] 4-bit values: each 32-byte run gives two sub-blocks (low, high)."""
    n = qs.shape[0]
    q = qs.reshape(n, 4, 1, 32) >> torch.tensor([0, 4], dtype=torch.uint8).view(1, 1, 2, 1)
    return (q & 0xF).reshape(n, 8, 32)


# The K-quants' unpackers also give, with `parts`, their scales' factors (and their offsets'):
# (super float32 [n, 1], sub int8 [n, S]) per block of 256, the file's fp16 d (or -dmin) and
# its small integer sub-block scales, whose product is the scale exactly (BlockValues).
Factors = tuple[torch.Tensor, torch.Tensor]
WithParts = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, Factors, Factors | None]


def _k_quant(q: torch.Tensor, d: torch.Tensor, sc: torch.Tensor, dmin: torch.Tensor | None,
             m: torch.Tensor | None, parts: bool) -> Unpacked | WithParts:  # fmt: skip
    """q with scale d * sc and offset dmin * m [n, S, 1], from super-block floats d and dmin
    (negated: -(x * m) and (-x) * m are the same float, -0.0 included) [n, 1] and sub-block
    integers sc and m as float32 [n, S]; with `parts`, also the factors."""
    n, subs = sc.shape
    scale = (d * sc).reshape(n, subs, 1)
    offset = None if dmin is None else (dmin * m).reshape(n, subs, 1)
    if not parts:
        return q, scale, offset
    offset_parts = None if dmin is None else (dmin, m.to(torch.int8))
    return q, scale, offset, (d, sc.to(torch.int8)), offset_parts


def _k_scales(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: d, the 8 sub-block scales, -dmin and the 8 mins (_k_quant's)."""
    scale, minimum = _k_scale_min(b[:, 4:16])
    return _f16(b, 0), scale, -_f16(b, 2), minimum


def _q4_k(b: torch.Tensor, parts: bool = False) -> Unpacked | WithParts:
    return _k_quant(_k_sub_blocks(b[:, 16:144]), *_k_scales(b), parts)


def _q5_k(b: torch.Tensor, parts: bool = False) -> Unpacked | WithParts:
    q = _k_sub_blocks(b[:, 48:176]) | (_bits(b[:, 16:48], 8) << 4)
    return _k_quant(q, *_k_scales(b), parts)


def _q6_k(b: torch.Tensor, parts: bool = False) -> Unpacked | WithParts:
    n = b.shape[0]
    sc = b[:, 192:208].contiguous().view(torch.int8).float()
    ql = b[:, 0:128].reshape(n, 2, 1, 64) >> torch.tensor([0, 4], dtype=torch.uint8).view(
        1, 1, 2, 1
    )
    ql = (ql & 0xF).reshape(n, 8, 32)
    qh = b[:, 128:192].reshape(n, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(
        1, 1, 4, 1
    )
    qh = (qh & 3).reshape(n, 8, 32)
    q = (ql | (qh << 4)).to(torch.int8) - 32
    return _k_quant(q.reshape(n, 16, 16), _f16(b, 208), sc, None, None, parts)


def _q2_k(b: torch.Tensor, parts: bool = False) -> Unpacked | WithParts:
    n = b.shape[0]
    scales = b[:, 0:16]
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)
    q = ((b[:, 16:80].reshape(n, 2, 1, 32) >> shifts) & 3).reshape(n, 16, 16)
    return _k_quant(q, _f16(b, 80), (scales & 0xF).float(), -_f16(b, 82),
                    (scales >> 4).float(), parts)  # fmt: skip


def _q3_k(b: torch.Tensor, parts: bool = False) -> Unpacked | WithParts:
    n = b.shape[0]
    s = b[:, 96:108]
    low = s[:, 0:8].reshape(n, 1, 8) >> torch.tensor([0, 4], dtype=torch.uint8).view(1, 2, 1)
    high = s[:, 8:12].reshape(n, 1, 4) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(
        1, 4, 1
    )
    scales = (low.reshape(n, 16) & 0xF) | ((high.reshape(n, 16) & 3) << 4)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)
    ql = ((b[:, 32:96].reshape(n, 2, 1, 32) >> shifts) & 3).reshape(n, 16, 16)
    qh = (_bits(b[:, 0:32], 8).reshape(n, 16, 16)) ^ 1  # the offset applies where the bit is 0
    q = ql.to(torch.int8) - (qh << 2).to(torch.int8)
    return _k_quant(q, _f16(b, 108), (scales.to(torch.int8) - 32).float(), None, None, parts)


_WITH_PARTS = (_q2_k, _q3_k, _q4_k, _q5_k, _q6_k)  # take `parts`


def _dequantize_blocks(b: torch.Tensor, fn) -> torch.Tensor:
    q, scale, offset = fn(b)
    w = scale * q.float()
    return (w if offset is None else w + offset).reshape(b.shape[0], -1)


_UNPACKERS: dict[int, Callable[[torch.Tensor], Unpacked]] = {
    Q4_0: _q4_0, Q4_1: _q4_1, Q5_0: _q5_0, Q5_1: _q5_1, Q8_0: _q8_0,
    Q2_K: _q2_k, Q3_K: _q3_k, Q4_K: _q4_k, Q5_K: _q5_k, Q6_K: _q6_k,
}  # fmt: skip

# The codebook and grid types (IQ1_S … IQ4_XS, TQ1_0, TQ2_0, MXFP4, NVFP4): gguf_iquants.py.
BLOCK_LAYOUT.update(gguf_iquants.BLOCK_LAYOUT)
TYPE_NAMES.update(gguf_iquants.TYPE_NAMES)
PACKED_BITS.update(gguf_iquants.PACKED_BITS)
_UNPACKERS.update(gguf_iquants.UNPACKERS)

# Rows dequantised per chunk: bounds the float32 temporaries of huge tensors (the embedding).
_CHUNK_BLOCKS = 1 << 16


def dequantize(
    raw: np.ndarray, ggml_type: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Bytes of one tensor (uint8 array) → a `dtype` tensor of `shape`."""
    # NOTE: a copy, because the file mapping is read-only and parameters must own their memory.
    data = torch.from_numpy(np.array(raw, copy=True))
    if ggml_type in (F32, F16, BF16):
        src = {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}[ggml_type]
        return data.view(src).reshape(shape).to(dtype)
    if ggml_type not in _UNPACKERS:
        tensor_nbytes(ggml_type, shape)  # raises the clear "unsupported type" error
    block, nbytes = BLOCK_LAYOUT[ggml_type]
    blocks = data.reshape(-1, nbytes)
    out = torch.empty(blocks.shape[0], block, dtype=dtype)
    fn = _UNPACKERS[ggml_type]
    for start in range(0, blocks.shape[0], _CHUNK_BLOCKS):
        stop = start + _CHUNK_BLOCKS
        out[start:stop] = _dequantize_blocks(blocks[start:stop], fn).to(dtype)
    return out.reshape(shape)


def is_block_quantized(ggml_type: int) -> bool:
    return ggml_type in _UNPACKERS


# Per type: the range of its integers q (every matrix of the type is stored in the width it
# needs, whatever its own values), and whether its block scales are fp16 values of the file.
_STORAGE: dict[int, tuple[tuple[int, int], bool]] = {
    Q4_0: ((-8, 7), True), Q4_1: ((0, 15), True), Q5_0: ((-16, 15), True),
    Q5_1: ((0, 31), True), Q8_0: ((-128, 127), True), Q2_K: ((0, 3), False),
    Q3_K: ((-4, 3), False), Q4_K: ((0, 15), False), Q5_K: ((0, 31), False),
    Q6_K: ((-32, 31), False),
}  # fmt: skip


def unpack(raw: np.ndarray, ggml_type: int, shape: tuple[int, int]) -> BlockValues:
    """Bytes of one 2-D block-quantised tensor → its BlockValues: q int8 [rows, cols], scale
    float32 [rows, cols / B], offset float32 [rows, cols / B] or None, B the sub-block size
    (16 or 32): weight[r, c] = scale[r, c // B] * q[r, c] + offset[r, c // B], exactly as
    `dequantize`; and the type's storage facts."""
    with warnings.catch_warnings():  # read-only: the unpackers only read (no 250 MB copy)
        warnings.simplefilter("ignore", UserWarning)
        data = torch.from_numpy(np.asarray(raw))
    _, nbytes = BLOCK_LAYOUT[ggml_type]
    blocks = data.reshape(-1, nbytes)
    if ggml_type in gguf_iquants.TYPES:  # with their codebooks and factored scales
        return gguf_iquants.block_values(blocks, ggml_type, *shape)
    fn = _UNPACKERS[ggml_type]
    q, scale, offset, *parts = fn(blocks, parts=True) if fn in _WITH_PARTS else fn(blocks)
    rows, cols = shape
    group = q.shape[-1]
    q = q.to(torch.int8).reshape(rows, cols)
    scale = scale.reshape(rows, cols // group)
    offset = None if offset is None else offset.reshape(rows, cols // group)

    def per_row(factors):  # a super-block per 256 inputs along a row, as the blocks are
        return None if factors is None else (factors[0].reshape(rows, cols // 256),
                                             factors[1].reshape(rows, cols // group))  # fmt: skip

    scale_parts, offset_parts = (per_row(f) for f in parts) if parts else (None, None)
    value_range, half_scales = _STORAGE[ggml_type]
    return BlockValues(q, scale, offset, value_range, half_scales, None, scale_parts, offset_parts)

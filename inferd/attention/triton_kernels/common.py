"""Pieces shared by the paged attention kernels: score transforms, operand preparation and the
tile sizes chosen on the host.

Scores live in the log2 domain inside the kernels (`exp2` is the cheap exponential on GPUs), so
every score is multiplied by log2(e) once, after scaling and soft-capping.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


def interpreted(kernel) -> bool:
    """Whether `kernel` runs under the interpreter: `triton.jit` decides when it decorates,
    from TRITON_INTERPRET, so this is fixed per process and import."""
    return not isinstance(kernel, triton.runtime.JITFunction)


@triton.jit
def tanh(x):
    # Core triton has no tanh that also runs in the interpreter; exp(-2|x|) never overflows.
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x >= 0, t, -t)


@triton.jit
def log2_scores(qk, scale, softcap, HAS_SOFTCAP: tl.constexpr):
    """Raw q·k products → scaled, optionally soft-capped scores, in the log2 domain."""
    s = qk * scale
    if HAS_SOFTCAP:
        s = softcap * tanh(s / softcap)
    return s * LOG2E


@triton.jit
def with_sinks(acc, m, l_sum, sinks_ptr, head, mask):
    """(acc, sum) of rows whose running max is `m` (log2 domain) with each row's sink logit
    (gpt-oss, per query head `head`) joined to the sum: rescaled to max(m, sink). A sink
    weighs no value, so it only rescales the accumulator."""
    sink = tl.load(sinks_ptr + head, mask=mask, other=0.0).to(tl.float32) * LOG2E
    top = tl.maximum(m, sink)
    alpha = tl.exp2(m - top)
    return acc * alpha[:, None], l_sum * alpha + tl.exp2(sink - top)


@triton.jit
def dot_operand(x, INTERPRETED: tl.constexpr):
    # NOTE: the CPU interpreter stores bfloat16 as raw uint16 and its tl.dot multiplies the bit
    # patterns (triton-lang/triton#11584), so on CPU the operands go through float32. The
    # products of two 16-bit floats are exact in float32, so this only changes summation order.
    if INTERPRETED:
        x = x.to(tl.float32)
    return x


@triton.jit
def downcast(x, dtype: tl.constexpr, INTERPRETED: tl.constexpr):
    """`x.to(dtype)` with round-to-nearest-even everywhere."""
    # NOTE: the CPU interpreter truncates float32 → bfloat16 where GPUs round to nearest even;
    # on CPU the rounding is done on the bits, so the tests see the values a GPU produces.
    if INTERPRETED and dtype == tl.bfloat16 and x.dtype == tl.float32:
        bits = x.to(tl.uint32, bitcast=True)
        bits += 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return x.to(dtype)


@triton.jit
def int8_row_scale(cache_ptr, row_off, HEAD_DIM: tl.constexpr, stride_cd, mask):
    """The float32 scales of int8 cache rows (inferd/kv_int8.py) starting at `row_off` (any
    shape): the 4 bytes after each row's HEAD_DIM codes, little-endian. NOTE: assembled byte by
    byte, so a row need not be 4-byte aligned (any head_dim); 4 byte loads against HEAD_DIM."""
    bits = tl.zeros(row_off.shape, dtype=tl.uint32)
    for i in tl.static_range(4):
        byte = tl.load(cache_ptr + row_off + (HEAD_DIM + i) * stride_cd, mask=mask, other=0)
        bits |= byte.to(tl.uint8, bitcast=True).to(tl.uint32) << (8 * i)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def int8_quantize(x):
    """x [rows, HEAD_PAD] float32 (columns past head_dim zero) -> (codes int8, scales float32
    [rows]): kv_int8.py's definition. NOTE: IEEE-rounded divisions (`div_rn`; a plain `/`
    compiles to an approximate one on GPUs) and round half to even by adding and subtracting
    1.5 * 2^23 (exact for |v| <= 127.5, no libdevice in the interpreter), so a GPU writes the
    bytes PyTorch's `quantize` writes."""
    amax = tl.max(tl.abs(x), 1)
    scale = tl.math.div_rn(amax, 127.0)
    divisor = tl.where(scale > 0, scale, 1.0)
    v = tl.math.div_rn(x, divisor[:, None])
    v = (v + 12582912.0) - 12582912.0
    v = tl.minimum(tl.maximum(v, -127.0), 127.0)
    return v.to(tl.int8), scale


@triton.jit
def mma(a, b, IEEE: tl.constexpr):
    # float32 operands default to TF32 tensor cores (10-bit mantissa); float32 models ask for
    # exact products so they match the reference. 16-bit operands ignore the choice.
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@dataclass(frozen=True)
class Tiles:
    group_pad: int  # query heads per KV head, padded to a power of two
    head_pad: int  # head_dim padded to a power of two (≥ 16, the smallest tl.dot side)
    block_q: int  # query tokens per prefill program (block_q * group_pad rows)
    block_n: int  # keys per inner-loop tile
    num_warps: int


def prefill_tiles(head_dim: int, group: int, exact_fp32: bool = False) -> Tiles:
    """~64 rows (tokens × heads of one KV group) per program, so each K/V tile loaded from the
    cache serves every query head that shares it. Wide heads get narrower key tiles and more
    warps, keeping the float32 accumulator [rows, head_dim] within the register file. Exact
    float32 products run on FMA units, not tensor cores, and need far smaller tiles not to spill.
    (Sizes checked for register spills with ptxas for sm_90; not tuned on a GPU.)"""
    head_pad = max(16, triton.next_power_of_2(head_dim))
    group_pad = triton.next_power_of_2(group)
    if exact_fp32:
        return Tiles(group_pad, head_pad, max(1, 16 // group_pad), 16, 4)
    block_q = max(1, 64 // group_pad)
    block_n = 64 if head_pad <= 128 else 32
    return Tiles(group_pad, head_pad, block_q, block_n, 4 if head_pad <= 128 else 8)


def decode_tiles(head_dim: int, group: int) -> Tiles:
    """One query token: the rows are the group's query heads, padded to 16 for tl.dot."""
    head_pad = max(16, triton.next_power_of_2(head_dim))
    group_pad = max(16, triton.next_power_of_2(group))
    block_n = 64 if head_pad <= 128 else 32
    return Tiles(group_pad, head_pad, 1, block_n, 4)

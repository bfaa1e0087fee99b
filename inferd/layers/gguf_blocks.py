"""`--quantization gguf`: linear layers that keep the checkpoint's own GGUF block quantisation.

Every GGUF type (Q4_0 … Q8_0, Q2_K … Q6_K) is, per sub-block of B = 32 (or 16) weights along the
input, `w = scale * q + offset` with small integers q. A `BlockWeight` holds exactly that, q as
one byte per weight: no weight value changes, unlike re-quantising a dequantised matrix to int8
or int4 (which rounds weights that were already rounded once). Products with few rows (decode)
go to the C kernel in cpu_kernels/block_gemv.c, which quantises each activation row to int8 per
32 values as llama.cpp does and sums exactly in integers (AVX-512 VNNI). Steps with many rows
(prefill) dequantise the weight to the model dtype and use PyTorch's GEMM, which is faster
there: a decode step is bound by reading weights, a prefill step by arithmetic.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Rows up to which the C kernel beats dequantise-then-GEMM (it re-reads the weights every 8 rows).
KERNEL_MAX_ROWS = 32


class BlockWeight(nn.Module):
    """u = q + 128 as uint8 [out, in], scale (and offset, or None) float32 [out, in / group]."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None,
                 compute_dtype: torch.dtype = torch.bfloat16):  # fmt: skip
        super().__init__()
        out_features, in_features = q.shape
        self.group = in_features // scale.shape[1]
        if self.group not in (16, 32) or in_features % 32:
            raise ValueError(f"unsupported block layout: {in_features} inputs, {scale.shape[1]} "
                             "blocks")  # fmt: skip
        self.register_buffer("u", q.to(torch.int8).view(torch.uint8) ^ 128)
        self.register_buffer("scale", scale.float().contiguous())
        self.register_buffer("offset", None if offset is None else offset.float().contiguous())
        self.compute_dtype = compute_dtype
        self.max_rows = 1 << 62  # serves every step (see forward)
        self.lib = None  # the C kernels, looked up at the first product

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.u.shape)

    def dequantized(self, rows: torch.Tensor | slice = slice(None)) -> torch.Tensor:
        """The float32 weights (of `rows`), bit-identical to the GGUF dequantisation."""
        u, scale = self.u[rows], self.scale[rows]
        q = u.view(torch.int8) ^ -128  # u - 128, reinterpreted without widening
        w = scale.repeat_interleave(self.group, dim=1) * q.float()
        if self.offset is not None:
            w = w + self.offset[rows].repeat_interleave(self.group, dim=1)
        return w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, in] → float32 [rows, out]."""
        if x.shape[0] > KERNEL_MAX_ROWS:
            w = self.dequantized().to(self.compute_dtype)
            return F.linear(x.to(self.compute_dtype), w).float()
        if self.lib is None:
            from inferd.cpu_kernels import kernel_library

            self.lib = kernel_library()
        x = x.float().contiguous()
        y = torch.empty(x.shape[0], self.u.shape[0], dtype=torch.float32)
        offset = None if self.offset is None else self.offset.data_ptr()
        rc = self.lib.inferd_block_gemv(x.data_ptr(), x.shape[0], x.shape[1], self.u.data_ptr(),
                                         self.scale.data_ptr(), offset, self.u.shape[0],
                                         self.group, y.data_ptr())  # fmt: skip
        if rc != 0:
            raise RuntimeError(f"block_gemv failed ({rc}) on a {tuple(x.shape)} input")
        return y

    def extra_repr(self) -> str:
        out_features, in_features = self.shape
        return (f"out={out_features}, in={in_features}, group={self.group}, "
                f"offset={self.offset is not None}")  # fmt: skip


def stack(parts: list[BlockWeight]) -> BlockWeight:
    """One BlockWeight from several along the output (q/k/v, gate/up): the finer group wins."""
    group = min(p.group for p in parts)

    def regroup(t: torch.Tensor, g: int) -> torch.Tensor:
        return t.repeat_interleave(g // group, dim=1)

    scale = torch.cat([regroup(p.scale, p.group) for p in parts])
    offset = None
    if any(p.offset is not None for p in parts):
        zeros = [torch.zeros_like(p.scale) for p in parts]
        offsets = [p.offset if p.offset is not None else z for p, z in zip(parts, zeros)]
        offset = torch.cat([regroup(o, p.group) for p, o in zip(parts, offsets)])
    q = torch.cat([p.u.view(torch.int8) ^ -128 for p in parts])
    return BlockWeight(q, scale, offset, parts[0].compute_dtype)

"""The int8 KV cache row (`--kv-cache-dtype int8`): one numeric definition that the torch, cpu
(C) and Triton attention backends, the runner's allocation and the memory planner all follow.

A row is one token's key (or value) vector of one KV head, `head_dim` values x:

    scale = max|x| / 127                 (float32; 0 when x is all zeros)
    q     = clamp(round(x / scale), -127, 127)   (round half to even; int8)
    x'    = q * scale                    (what attention reads, in float32)

stored as `head_dim` int8 codes followed by the scale's 4 bytes (little-endian float32):
`head_dim + 4` bytes. A layer's cache stays ONE tensor, int8
`[2, num_blocks, block_size, kv_heads, head_dim + 4]`.

Why per token and per KV head: the scale depends on nothing but the vector itself, so a token's
codes are the same whichever step, batch, prefill chunk or speculative verification wrote it;
the default mode's rows stay independent of their step (docs/attention.md). A per-block or
per-channel scale would change with the other tokens of the block (and re-quantising a block
as it fills would change earlier rows). A scale per KV head rather than one per token: heads
differ in range, and a scale shared by a token's heads would spend the bits on the widest one.
The cost is 4 bytes per head_dim codes: 1.6 % more at head_dim 256, 3.1 % at 128.

Why inline, not a separate scale tensor: a block is still exactly `cache[:, block]` (what the
runner zeroes and copies and the KV connector saves and loads, runner.block_tensors), one
pointer per layer reaches a row's codes and scale together (the C and Triton kernels read
`row_at(slot, head)` and find the scale right after the codes), and all-zero bytes read back as
zeros (codes 0, scale 0.0), so a zeroed block is a valid block. No alignment is assumed: the
C kernels `memcpy` the scale, the Triton kernels assemble its four bytes, PyTorch copies them
out; any head_dim works.

Error: |x - x'| <= scale / 2 = max|x| / 254 per value (the round-off of one division and one
product adds at most a few float32 ulps of max|x|).
"""

from __future__ import annotations

import torch

INT8_KV = torch.int8  # the cache tensor's dtype marks the format
SCALE_BYTES = 4  # a float32 scale after each row's codes
QMAX = 127.0  # symmetric: -128 is never used, so -q is always a code


def row_width(head_dim: int, kv_dtype: torch.dtype) -> int:
    """Elements of one cache row (the cache tensor's last dimension) for `kv_dtype`."""
    return head_dim + SCALE_BYTES if kv_dtype == INT8_KV else head_dim


def quantize(x: torch.Tensor) -> torch.Tensor:
    """x [..., head_dim] (any float dtype) -> int8 rows [..., head_dim + 4]: codes, then the
    scale's bytes. NOTE: the same IEEE operations as kv_int8.h's `kv_int8_quantize` (float32
    max, one division for the scale and one per value, round half to even), so the C decoder
    layer and this function write the same bytes."""
    if x.numel() == 0:  # (an empty scale has no stride to view as bytes)
        return x.new_empty(*x.shape[:-1], x.shape[-1] + SCALE_BYTES, dtype=INT8_KV)
    x = x.float()
    scale = x.abs().amax(-1, keepdim=True) / QMAX
    divisor = torch.where(scale > 0, scale, 1.0)  # an all-zero row: codes 0, scale 0
    codes = torch.round(x / divisor).clamp_(-QMAX, QMAX).to(torch.int8)
    return torch.cat([codes, scale.view(torch.int8)], dim=-1)


def scales(rows: torch.Tensor) -> torch.Tensor:
    """The float32 scale of each int8 row [..., head_dim + 4] -> [..., 1]."""
    return rows[..., -SCALE_BYTES:].contiguous().view(torch.float32)


def dequantize(rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """int8 rows [..., head_dim + 4] -> values [..., head_dim]: codes x scale in float32, then
    `dtype`."""
    values = rows[..., :-SCALE_BYTES].float() * scales(rows)
    return values if dtype == torch.float32 else values.to(dtype)

"""FP8 (e4m3fn) linear weights kept as stored, one byte a weight, and the C kernel that multiplies
by them (cpu_kernels/fp8_gemm.c).

HF checkpoints in the compressed-tensors format store a linear layer's weight as float8_e4m3fn
codes with a float32 scale per output row (or one per tensor, passed here expanded to the rows).
`Fp8Weight` keeps those bytes, repacked once into the kernel's layout: output rows in groups of
16 (the last padded with code 0), per group and input the 16 rows' codes side by side, so that one
vector of converted codes serves 16 outputs. Nothing makes a float copy of the matrix: the
kernel converts codes as it multiplies (`dequantized` makes floats of a few rows, for an
embedding lookup or a test's reference).

`forward` is the C kernel. Its numeric definition (fp8_gemm.c's opening comment): each output
sums x[m, k] * w'[n, k] over k in order with one fused multiply-add each, w' = w / 256 (the codes'
exact fp16 form), then multiplies by 256 * scale[n]. So a row's outputs are the same bits alone
or in any batch, and the same in every ISA variant.
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

GROUP = 16  # output rows per group (cpu_kernels/fp8_gemm.c)
CHUNK_BYTES = 1 << 24  # codes repacked at a time (whole groups of rows): bounded temporaries
BLOCK = 32  # K must be a multiple of this (the kernel's unrolled loops)
FP16_SHIFT = 256.0  # w' = w / 256: folded into the kernel's scales

_P, _I = ctypes.c_void_p, ctypes.c_int64


class Fp8Matrix(ctypes.Structure):
    """Mirrors the C struct in cpu_kernels/kernels.h."""

    _fields_ = [("codes", _P), ("scale", _P), ("N", _I), ("K", _I)]


def e4m3_values() -> torch.Tensor:
    """The float32 value of each of the 256 e4m3fn codes, from the format: a sign, 4 exponent
    bits biased by 7, 3 mantissa bits; exponent 0 is subnormal (m/8 * 2^-6); 0x7F and 0xFF are
    NaN (no infinities)."""
    code = torch.arange(256, dtype=torch.int64)
    e, m = (code >> 3) & 15, (code & 7).double()
    normal = (8 + m) * torch.pow(2.0, (e - 10).double())  # (1 + m/8) * 2^(e-7)
    magnitude = torch.where(e > 0, normal, m * 2.0**-9)  # subnormal: m/8 * 2^-6
    value = torch.where(code >= 128, -magnitude, magnitude).float()  # exact: 4 significant bits
    return torch.where((code & 0x7F) == 0x7F, torch.tensor(float("nan")), value)


E4M3 = e4m3_values()


def _checked(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The scale as float32 [N]; ValueError naming the parameter for anything the kernel cannot
    take."""
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
        got = codes.dtype if isinstance(codes, torch.Tensor) else type(codes).__name__
        hint = " (view float8_e4m3fn weights as torch.uint8)" if got == torch.float8_e4m3fn else ""
        raise ValueError(f"codes must be a torch.uint8 tensor of e4m3fn bytes, got {got}{hint}")
    if codes.dim() != 2 or codes.device.type != "cpu":
        raise ValueError(f"codes must be a 2-D CPU tensor [N, K], got shape {tuple(codes.shape)} "
                         f"on {codes.device}")  # fmt: skip
    n, k = codes.shape
    if n < 1 or k < BLOCK or k % BLOCK:
        raise ValueError(f"codes [N, K] needs N >= 1 and K a positive multiple of {BLOCK}, got "
                         f"N={n}, K={k}")  # fmt: skip
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32:
        got = scale.dtype if isinstance(scale, torch.Tensor) else type(scale).__name__
        raise ValueError(f"scale must be a float32 tensor [N], got {got}")
    if scale.shape not in ((n,), (n, 1)) or scale.device.type != "cpu":
        raise ValueError(f"scale must be a CPU tensor [N] = [{n}] (one per output row of codes), "
                         f"got shape {tuple(scale.shape)} on {scale.device}")  # fmt: skip
    return scale.reshape(n).contiguous()


def _repacked(codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """codes [N, K] → (the kernel's layout [ceil(N/16), K, 16], whether each row holds a NaN
    code), about CHUNK_BYTES of codes at a time: each temporary is a chunk's size, never the
    matrix's."""
    n, k = codes.shape
    packed = torch.zeros(-(-n // GROUP), k, GROUP, dtype=torch.uint8)
    has_nan = torch.empty(n, dtype=torch.bool)
    step = max(1, CHUNK_BYTES // (k * GROUP)) * GROUP
    for start in range(0, n, step):
        rows = codes[start : start + step]
        # 0x7F and 0xFF: the only codes whose bits or 0x80 give 0xFF (~5x faster than == and any)
        has_nan[start : start + len(rows)] = (rows | 0x80).amax(dim=1) == 0xFF
        g0, whole = start // GROUP, len(rows) // GROUP
        packed[g0 : g0 + whole] = rows[: whole * GROUP].reshape(whole, GROUP, k).transpose(1, 2)
        if len(rows) % GROUP:  # the last rows: a group padded with code 0
            packed[g0 + whole, :, : len(rows) % GROUP] = rows[whole * GROUP :].T
    return packed, has_nan


class Fp8Weight(nn.Module):
    """A linear layer's FP8 weight: out = x @ (decode(codes) * scale[:, None]).T by the C kernel.

    codes: torch.uint8 [N, K], the e4m3fn bytes (N >= 1, K a multiple of 32); scale: float32
    [N], one per output row (a per-tensor scale expanded; [N, 1] is taken too)."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor):
        super().__init__()
        scale = _checked(codes, scale)
        packed, has_nan = _repacked(codes)
        self.shape = tuple(codes.shape)
        # NOTE: the kernel's scales are 256 * scale (exact unless it overflows: w' = w / 256),
        # NaN for a row holding a NaN code (fp8_gemm.c converts those codes to finite values)
        kernel_scale = torch.zeros(packed.shape[0] * GROUP, dtype=torch.float32)
        kernel_scale[: self.shape[0]] = torch.where(has_nan, float("nan"), scale * FP16_SHIFT)
        self.register_buffer("codes", packed, persistent=False)
        self.register_buffer("scale", scale.clone(), persistent=False)
        self.register_buffer("kernel_scale", kernel_scale, persistent=False)
        self.lib = None  # the C kernels, looked up at the first product (a test may set it)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scale,
                                                          self.kernel_scale))  # fmt: skip

    def _kernels(self):
        if self.lib is None:
            from inferd.cpu_kernels import kernel_library

            self.lib = kernel_library()
        return self.lib

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x float32 [M, K] (any leading dimensions; other float types are converted) → float32
        [M, N]."""
        n, k = self.shape
        if not x.is_floating_point() or x.dim() < 1 or x.shape[-1] != k or x.device.type != "cpu":
            raise ValueError(f"x must be a float CPU tensor [M, {k}], got {x.dtype} "
                             f"{tuple(x.shape)} on {x.device}")  # fmt: skip
        lib = self._kernels()
        rows = x.reshape(-1, k).to(torch.float32).contiguous()
        y = torch.empty(rows.shape[0], n, dtype=torch.float32)
        if rows.shape[0]:
            # built at each call: the buffers' addresses are those of now (after any .to())
            matrix = Fp8Matrix(self.codes.data_ptr(), self.kernel_scale.data_ptr(), n, k)
            rc = lib.inferd_fp8_gemm(rows.data_ptr(), rows.shape[0], ctypes.byref(matrix),
                                     y.data_ptr(), n)  # fmt: skip
            if rc != 0:
                raise RuntimeError(f"inferd_fp8_gemm failed ({rc}) on a {tuple(rows.shape)} input")
        return y.view(*x.shape[:-1], n)

    def dequantized(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """float32 [len(rows), K] (every row when None) = decode(codes) * scale, bit for bit what
        torch's float8_e4m3fn conversion times the scale gives."""
        n, k = self.shape
        if rows is None:
            step = max(1, CHUNK_BYTES // k)  # the table lookup's int32 indexes: 4 bytes a weight
            return torch.cat([self.dequantized(torch.arange(s, min(s + step, n)))
                              for s in range(0, n, step)])  # fmt: skip
        rows = torch.as_tensor(rows, dtype=torch.int64).reshape(-1)
        if rows.numel() and not (0 <= int(rows.min()) and int(rows.max()) < n):
            raise ValueError(f"rows must lie in [0, {n}), got {rows.min()} .. {rows.max()}")
        codes = self.codes[rows // GROUP, :, rows % GROUP]  # [len(rows), K]
        return E4M3[codes.int()] * self.scale[rows, None]

    def extra_repr(self) -> str:
        n, k = self.shape
        return f"out={n}, in={k}: fp8 e4m3fn, a scale per row, {self.nbytes / 2**20:.1f} MiB"

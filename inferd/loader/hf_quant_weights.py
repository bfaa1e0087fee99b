"""One pre-quantised linear weight of an HF checkpoint, read as the block values inferd's C
kernels multiply by (`BlockValues`: w[r, c] = scale[r, c // 32] * q[r, c] + offset[r, c // 32]).

Each format's integers become q unchanged and its scales become the block scales, repeated
over the 32-input blocks of a group (a group of 128 is four blocks with one scale), so no
weight changes value:

* AWQ (GEMM layout): `qweight` int32 [in, out / 8], eight 4-bit values per word along the
  outputs in the order 0 2 4 6 1 3 5 7; `qzeros` the same over groups; `scales` fp16
  [in / group, out]. w = (q - zero) * scale: q kept, offset = -zero * scale.
* GPTQ: `qweight` int32 [in * bits / 32, out], values along the inputs in order; `qzeros`
  [groups, out * bits / 32] along the outputs (the original format stores zero - 1); `scales`
  fp16 [groups, out]; `g_idx` [in]: each input's group. With act-order the groups are not
  contiguous: the inputs are sorted by group (`input_order`) and the layer gathers its input
  columns in that order before multiplying. Symmetric (every zero at the middle of the range):
  q - zero with no offset, as a GGUF Q4_0/Q8_0; else offsets.
* compressed-tensors INT8: `weight` int8 [out, in], `weight_scale` [out, 1] or [out, in / group],
  `weight_zero_point` when asymmetric.

Every read takes a range of output rows (the loader packs a big matrix a range at a time) and
never a dense float copy. Tensor parallelism does not split block layers (cols must be None).
"""

from __future__ import annotations

import torch

from inferd.layers.gguf_blocks import BlockValues
from inferd.loader.hf_quant_config import QuantFormat

BLOCK = 32
_AWQ_COLUMN_NIBBLE = (0, 4, 1, 5, 2, 6, 3, 7)  # output j of a word is nibble _AWQ...[j]


def _words_along_rows(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 [a, w] → int32 [a, w * (32 / bits)]: value j of word w is column w * per + j."""
    per = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    values = (packed[:, :, None] >> shifts) & ((1 << bits) - 1)
    return values.reshape(packed.shape[0], packed.shape[1] * per)


def _per_block(per_group: torch.Tensor, group: int, k: int) -> torch.Tensor:
    """[rows, groups] → [rows, k / 32]: a group's value repeated over its 32-input blocks."""
    return per_group.repeat_interleave(group // BLOCK, dim=1) if group > BLOCK else per_group


class _QuantizedWeight:
    """Common: the checkpoint's tensors of one layer and the format."""

    def __init__(self, tensors: dict, fmt: QuantFormat, name: str, shape: tuple[int, int]):
        self.tensors, self.fmt, self.name, self.shape = tensors, fmt, name, shape
        self.input_order: torch.Tensor | None = None  # GPTQ act-order only

    def _rows(self, rows, cols) -> tuple[int, int]:
        if cols is not None:
            raise ValueError(f"{self.name}: {self.fmt.name} layers are not split across "
                             "tensor-parallel ranks")  # fmt: skip
        return (0, self.shape[0]) if rows is None else rows

    def _check(self, key: str, got: tuple[int, ...], want: tuple[int, ...]) -> None:
        if tuple(got) != tuple(want):
            raise ValueError(
                f"{self.name}.{key} has shape {tuple(got)}, the format needs "
                f"{tuple(want)} for a {self.shape[0]} x {self.shape[1]} weight"
            )

    def load(self, dtype: torch.dtype, rows=None, cols=None) -> torch.Tensor:
        """The dequantised rows (a few: an embedding lookup, a test's reference)."""
        v = self.load_blocks(rows, cols)
        w = v.q.float() * v.scale.repeat_interleave(BLOCK, 1)
        if v.offset is not None:
            w = w + v.offset.repeat_interleave(BLOCK, 1)
        if self.input_order is not None:  # back to the checkpoint's input order
            w = w[:, torch.argsort(self.input_order)]
        return w.to(dtype)


def _grouped(fmt: QuantFormat, k: int) -> int:
    return fmt.group_size or k


class AwqWeight(_QuantizedWeight):
    def __init__(self, tensors: dict, fmt: QuantFormat, name: str):
        k, packed_out = tensors["qweight"].shape
        super().__init__(tensors, fmt, name, (packed_out * 8, k))
        group = _grouped(fmt, k)
        if k % group or k % BLOCK:
            raise ValueError(f"{name}: {k} inputs are not whole groups of {group}")
        self._check("qzeros", tensors["qzeros"].shape, (k // group, packed_out))
        self._check("scales", tensors["scales"].shape, (k // group, packed_out * 8))

    def _outputs(self, key: str, start: int, n: int) -> torch.Tensor:
        """[rows of the tensor, n] 4-bit values of outputs start .. start + n."""
        first, last = start // 8, -(-(start + n) // 8)
        words = self.tensors[key].load(torch.int32, cols=(first, last - first))
        values = _words_along_rows(words, 4).view(words.shape[0], -1, 8)
        values = values[:, :, list(_AWQ_COLUMN_NIBBLE)].reshape(words.shape[0], -1)
        return values[:, start - first * 8 : start - first * 8 + n]

    def load_blocks(self, rows=None, cols=None) -> BlockValues:
        start, n = self._rows(rows, cols)
        k, group = self.shape[1], _grouped(self.fmt, self.shape[1])
        q = self._outputs("qweight", start, n).t().to(torch.int8).contiguous()
        zeros = self._outputs("qzeros", start, n).t().float()
        scales = self.tensors["scales"].load(torch.float32, cols=(start, n)).t()
        return BlockValues(q, _per_block(scales, group, k).contiguous(),
                           _per_block(-zeros * scales, group, k).contiguous(),
                           value_range=(0, 15))  # fmt: skip


class GptqWeight(_QuantizedWeight):
    def __init__(self, tensors: dict, fmt: QuantFormat, name: str):
        rows_packed, n = tensors["qweight"].shape
        k = rows_packed * 32 // fmt.bits
        super().__init__(tensors, fmt, name, (n, k))
        group = _grouped(fmt, k)
        if k % group or k % BLOCK:
            raise ValueError(f"{name}: {k} inputs are not whole groups of {group}")
        groups = k // group
        self._check("qzeros", tensors["qzeros"].shape, (groups, n * fmt.bits // 32))
        self._check("scales", tensors["scales"].shape, (groups, n))
        if "g_idx" in tensors:
            self._check("g_idx", tensors["g_idx"].shape, (k,))
            g_idx = tensors["g_idx"].load(torch.int64)
            contiguous = torch.arange(k) // group
            if not torch.equal(g_idx, contiguous):  # act-order: sort the inputs by group
                if not fmt.desc_act:  # NOTE: the weight cache keeps no input order
                    raise ValueError(f"{name}.g_idx is not in input order, but desc_act is "
                                     "false in quantization_config")  # fmt: skip
                order = torch.argsort(g_idx, stable=True)
                if not torch.equal(g_idx[order], contiguous):
                    raise ValueError(f"{name}.g_idx does not give every group {group} inputs")
                self.input_order = order

    def load_blocks(self, rows=None, cols=None) -> BlockValues:
        start, n = self._rows(rows, cols)
        bits, (_, k) = self.fmt.bits, self.shape
        group, per = _grouped(self.fmt, k), 32 // bits
        q = _words_along_rows(
            self.tensors["qweight"].load(torch.int32, cols=(start, n)).t(), bits
        )  # [n, k] fmt: skip
        if self.input_order is not None:
            q = q[:, self.input_order]
        first, last = start // per, -(-(start + n) // per)
        zwords = self.tensors["qzeros"].load(torch.int32, cols=(first, last - first))
        zeros = _words_along_rows(zwords, bits)[:, start - first * per : start - first * per + n]
        zeros = zeros.t() + (1 if self.fmt.gptq_v1_zeros else 0)  # [n, groups]
        scales = self.tensors["scales"].load(torch.float32, cols=(start, n)).t()
        middle = 1 << (bits - 1)
        if torch.all(zeros == middle):  # symmetric: q - zero, as a GGUF Q4_0 / Q8_0
            return BlockValues((q - middle).to(torch.int8),
                               _per_block(scales, group, k).contiguous(),
                               value_range=(-middle, middle - 1))  # fmt: skip
        # Asymmetric: 4-bit q as stored; 8-bit q - 128 (int8), its offset adds 128 back.
        shift = 128 if bits == 8 else 0
        offset = (shift - zeros.float()) * scales
        return BlockValues((q - shift).to(torch.int8), _per_block(scales, group, k).contiguous(),
                           _per_block(offset, group, k).contiguous(),
                           value_range=(0, 15) if bits == 4 else (-128, 127))  # fmt: skip


class Int8Weight(_QuantizedWeight):
    """compressed-tensors INT8: q as stored, one scale (and zero point) per row or group."""

    def __init__(self, tensors: dict, fmt: QuantFormat, name: str):
        n, k = tensors["weight"].shape
        super().__init__(tensors, fmt, name, (n, k))
        group = _grouped(self.fmt, k)
        if k % group or k % BLOCK:
            raise ValueError(f"{name}: {k} inputs are not whole groups of {group}")
        self._check("weight_scale", tensors["weight_scale"].shape, (n, k // group))
        if "weight_zero_point" in tensors:
            self._check("weight_zero_point", tensors["weight_zero_point"].shape, (n, k // group))

    def load_blocks(self, rows=None, cols=None) -> BlockValues:
        start, n = self._rows(rows, cols)
        k = self.shape[1]
        group = _grouped(self.fmt, k)
        q = self.tensors["weight"].load(torch.int8, rows=(start, n))
        scales = self.tensors["weight_scale"].load(torch.float32, rows=(start, n))
        offset = None
        if "weight_zero_point" in self.tensors:
            zeros = self.tensors["weight_zero_point"].load(torch.float32, rows=(start, n))
            if torch.any(zeros != 0):
                offset = _per_block(-zeros * scales, group, k).contiguous()
        return BlockValues(q.contiguous(), _per_block(scales, group, k).contiguous(), offset,
                           value_range=(-128, 127))  # fmt: skip


class Fp8StoredWeight:
    """compressed-tensors FP8: e4m3 bytes [out, in] and a float32 scale per row (a per-tensor
    scale repeated), plus the static activation scale when the checkpoint has one."""

    def __init__(self, tensors: dict, fmt: QuantFormat, name: str):
        self.tensors, self.fmt, self.name = tensors, fmt, name
        self.shape = tuple(tensors["weight"].shape)
        scale = tuple(tensors["weight_scale"].shape)
        if scale not in ((), (1,), (self.shape[0], 1), (self.shape[0],)):
            raise ValueError(f"{name}.weight_scale has shape {scale}: not per tensor or per row")
        if "input_scale" in tensors and tuple(tensors["input_scale"].shape) not in ((), (1,)):
            raise ValueError(f"{name}.input_scale must be one number (a per-tensor scale)")

    def load_fp8(self, rows=None, cols=None) -> tuple[torch.Tensor, torch.Tensor, float | None]:
        """(codes uint8 [n, in], scale float32 [n], static input scale or None)."""
        if cols is not None:
            raise ValueError(f"{self.name}: FP8 layers are not split across tensor-parallel ranks")
        start, n = (0, self.shape[0]) if rows is None else rows
        codes = self.tensors["weight"].load(torch.float8_e4m3fn, rows=(start, n))
        scale = self.tensors["weight_scale"].load(torch.float32).reshape(-1)
        scale = scale.expand(self.shape[0]) if scale.numel() == 1 else scale
        input_scale = None
        if "input_scale" in self.tensors:
            input_scale = float(self.tensors["input_scale"].load(torch.float32).reshape(-1)[0])
        return codes.view(torch.uint8), scale[start : start + n].contiguous(), input_scale

    def load(self, dtype: torch.dtype, rows=None, cols=None) -> torch.Tensor:
        codes, scale, _ = self.load_fp8(rows, cols)
        return (codes.view(torch.float8_e4m3fn).float() * scale[:, None]).to(dtype)

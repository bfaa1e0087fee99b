"""RMSNorm in the two conventions checkpoints use, computed in float32 as HF transformers does."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inferd.layers.weight_scheme import WeightScheme


class RMSNorm(nn.Module):
    """y = x / rms(x) * w  (Llama, Qwen), or  x / rms(x) * (1 + w)  with `unit_offset` (Gemma).

    The two differ in where they round: Llama-style multiplies the weight after casting back to
    the input dtype, Gemma-style before. Both are kept exactly, so low-precision runs match HF.
    `F.rms_norm` over float32 input gives the same bits as the written-out formula in one op.
    """

    def __init__(self, dim: int, eps: float, unit_offset: bool = False, dtype=None,
                 out_dtype: torch.dtype | None = None, kernel=None):  # fmt: skip
        """`out_dtype`: None for the weights' dtype (the input of a matmul); float32 for the
        residual stream or for kernels that round float32 activations themselves. `kernel`:
        inferd's C kernels, to normalise in one call instead of PyTorch's ~8 small ops, with a
        summation order fixed per row (cpu_kernels/rms_norm.c)."""
        super().__init__()
        self.dim, self.eps, self.unit_offset = dim, eps, unit_offset
        self.out_dtype = out_dtype
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)
        self._gain: torch.Tensor | None = None  # float32 (1 + w), set by `finalize`
        self.kernel = kernel

    def finalize(self) -> None:
        """Precompute the float32 gain once the weights are loaded (same bits as per call)."""
        self._gain = (1.0 + self.weight.float()) if self.unit_offset else None

    def float_gain(self) -> torch.Tensor:
        """The float32 multiplier applied after normalising: (1 + w) for Gemma, else w."""
        if self.unit_offset:
            return self._gain if self._gain is not None else 1.0 + self.weight.float()
        return self.weight.float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.out_dtype or self.weight.dtype
        x32 = x if x.dtype == torch.float32 else x.float()
        if self.kernel is not None and x32.device.type == "cpu":
            if self.unit_offset or torch.float32 in (self.weight.dtype, out):
                y = kernel_rms_norm(self.kernel, x32, self.float_gain(), self.eps)
                return y if out == torch.float32 else y.to(out)
            y = kernel_rms_norm(self.kernel, x32, None, self.eps).to(self.weight.dtype)
            return (self.weight * y).to(out)  # HF's rounding, as below
        if self.unit_offset:
            y = F.rms_norm(x32, (self.dim,), self.float_gain(), self.eps)
            return y if out == torch.float32 else y.to(out)
        if self.weight.dtype == torch.float32:
            return F.rms_norm(x32, (self.dim,), self.weight, self.eps).to(out)
        y = self.weight * F.rms_norm(x32, (self.dim,), None, self.eps).to(self.weight.dtype)
        return y.to(out)


def scheme_norm(scheme: WeightScheme, dim: int, eps: float, unit_offset: bool,
                residual: bool = False) -> RMSNorm:  # fmt: skip
    """A norm as the model's weight scheme wants it: output in the scheme's activation dtype
    (float32 for norms whose output joins the residual stream), by the C kernel where the scheme
    uses one."""
    out = torch.float32 if residual else scheme.activations
    return RMSNorm(dim, eps, unit_offset, scheme.dtype, out_dtype=out, kernel=scheme.norm_kernel())


def kernel_rms_norm(lib, x: torch.Tensor, gain: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension of float32 `x` by the C kernel (gain float32 or None)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    dim = x.shape[-1]
    lib.inferd_rms_norm(x.data_ptr(), None if gain is None else gain.data_ptr(),
                        x.numel() // dim, dim, eps, out.data_ptr())  # fmt: skip
    return out


def stacked_gain(norms: list[tuple[RMSNorm, int]]) -> torch.Tensor | None:
    """One [sum(heads), dim] float32 gain for several per-head norms applied as one (q and k
    norms over the heads of a fused projection). None unless all use the (1 + w) form."""
    if not all(n.unit_offset for n, _ in norms):
        return None
    return torch.cat([(1.0 + n.weight.float()).expand(heads, -1) for n, heads in norms])

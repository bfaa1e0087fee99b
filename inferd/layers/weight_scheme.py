"""How a model holds its weights and which kernels multiply by them: one `WeightScheme`, chosen
once at load (`choose_scheme`) and handed to the model's constructor. Every linear layer,
embedding and LM head asks it for its `LinearMethod` (linear_method.py), every norm for its
output dtype and kernel; nothing is switched on modules afterwards.

With no `--quantization` and `--dtype auto`, the scheme is the fastest accurate one for the
machine and the checkpoint (docs/performance.md has the measurements behind it):

* a GGUF file on a CPU where inferd's C kernels build: the file's own blocks, unchanged, and the
  C block kernel at every step size (`gguf`, the same as `--quantization gguf`): one numeric
  definition for decode, prefill and big batches, each row's result independent of the others
  (exact integer sums); tensors the file keeps in floating point stay float32;
* an HF folder with pre-quantised weights (AWQ, GPTQ, compressed-tensors INT8 / FP8, MXFP4:
  inferd/loader/hf_quant_config.py) on a CPU: the checkpoint's own integers and scales repacked
  into the C kernels' blocks (FP8: its own C kernel), the way a GGUF file's are kept;
* anything else (an HF folder, a GPU, tensor parallelism, no C compiler): dense weights in
  bfloat16 where the device computes it fast, else float32.

`--quantization` and `--dtype` force a mode: `--dtype float32` is the HF parity mode.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
from dataclasses import dataclass, field

import torch

import inferd.cpu_info as cpu_info
from inferd.layers.block_method import BlockMethod
from inferd.layers.fp8_checkpoint_method import Fp8CheckpointMethod
from inferd.layers.linear_method import DenseMethod, LinearMethod
from inferd.layers.quant import INT4_ROW_LIMITS, Fp8Method, Int4Method, Int8Method
from inferd.layers.row_tiles import TILE_ROWS, RowTiledMethod
from inferd.platform import resolve_dtype

log = logging.getLogger(__name__)

QUANTIZATION_METHODS = ("gguf", "int8", "int4", "fp8")


@dataclass(frozen=True)
class WeightScheme:
    name: str  # what `describe` and the logs call it: float32, gguf, int8, ...
    dtype: torch.dtype  # dense weights (with blocks: the tensors the file does not quantise)
    blocks: bool = False  # keep a GGUF file's block-quantised tensors as they are
    quantize: str | None = None  # int8 | int4 | fp8: re-quantise the loaded dense weights
    # --deterministic: dense layers in fixed-shape row tiles, norms by the C kernel, so that a
    # row's result never depends on the other rows of its step (row_tiles.py; blocks are so
    # by construction)
    deterministic: bool = False
    kernels: ctypes.CDLL | None = field(default=None, compare=False, repr=False)
    reason: str = field(default="", compare=False)  # why this scheme: a flag, or the machine
    # An HF checkpoint's pre-quantised format (a QuantFormat), kept as it is stored (blocks)
    stored: object | None = field(default=None, compare=False)

    @classmethod
    def dense(cls, dtype: torch.dtype, reason: str = "") -> WeightScheme:
        return cls(str(dtype).removeprefix("torch."), dtype, reason=reason)

    @property
    def activations(self) -> torch.dtype:
        """What norms hand the linear layers: the block and int8 kernels round float32
        activations themselves (rounding to bf16 first would only add error)."""
        return torch.float32 if self.blocks or self.quantize == "int8" else self.dtype

    @property
    def kv_cache_dtype(self) -> torch.dtype:
        """The KV cache dtype `auto` means: bfloat16 with blocks, else the model dtype. NOTE: the
        C decoder layer rounds each key and value to bf16 as it writes them and attends in
        float32, so a row's result still depends on its position alone; the cache takes half
        the memory of float32 (the largest part of a big batch's RSS after the weights) at a
        top-1 agreement with float32 of 0.99 (tests/parity/test_quantization_accuracy.py)."""
        return torch.bfloat16 if self.blocks else self.dtype

    def norm_kernel(self) -> ctypes.CDLL | None:
        """The C RMSNorm in block mode (one call instead of ~8 ops) and with `deterministic`
        (its sums have a fixed order per row, PyTorch's reductions split rows by the step)."""
        return self.kernels if self.blocks or self.deterministic else None

    def linear_method(self, kind: str) -> LinearMethod:
        """A fresh method for one layer; `kind`: linear, head or embedding."""
        if kind not in ("linear", "head", "embedding"):
            raise ValueError(f"unknown kind of matrix {kind!r}")
        matrix = "linear" if kind == "linear" else "head"  # a tied head shares the embedding's
        if self.stored is not None and self.stored.method == "fp8" and kind == "linear":
            return Fp8CheckpointMethod(self.stored.activations)
        if self.blocks:
            return BlockMethod()
        if self.quantize is None or kind == "embedding":
            if self.deterministic and kind != "embedding":
                return RowTiledMethod()
            return DenseMethod()  # a quantised model still looks its embeddings up densely
        if self.quantize == "int8":
            return Int8Method()
        if self.quantize == "int4":
            return Int4Method(INT4_ROW_LIMITS[matrix])
        return Fp8Method()

    def head_shares_embedding(self) -> bool:
        """Whether a tied LM head multiplies by the embedding's own method (same weights, same
        format); a re-quantised head gets a format of its own, a dense deterministic one its
        row tiles (over the embedding's matrix)."""
        return self.quantize is None and (self.blocks or not self.deterministic)

    def describe(self) -> str:
        """What the weights are and which kernels multiply by them, and why (the start-up line
        `inferd: weights: ...`)."""
        return self._what() + (f"; {self.reason}" if self.reason else "")

    def _what(self) -> str:
        if self.deterministic and not self.blocks:
            return self._dense_what() + f", {TILE_ROWS}-row tiles (--deterministic)"
        return self._dense_what()

    def _dense_what(self) -> str:
        if self.stored is not None:
            kernel = "inferd's FP8 C kernel" if self.stored.method == "fp8" else (
                "C block kernels")  # fmt: skip
            return (f"{self.name}: the checkpoint's {self.stored.describe()}, repacked for "
                    f"{kernel} at every step size; other tensors {_name(self.dtype)}")
        if self.blocks:
            return (f"{self.name}: the GGUF blocks with C kernels at every step size (one C call "
                    "for all decoder layers of a step)")  # fmt: skip
        if self.quantize:
            return f"{self.name}: weights re-quantised at load"
        return f"{self.name}: dense {_name(self.dtype)} weights"


def as_scheme(scheme: WeightScheme | torch.dtype) -> WeightScheme:
    """A scheme as given, or dense weights in a dtype given instead."""
    return scheme if isinstance(scheme, WeightScheme) else WeightScheme.dense(scheme)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _kernels_or_reason():
    from inferd.cpu_kernels import KernelsUnavailable, kernel_library

    try:
        return kernel_library(), None
    except KernelsUnavailable as e:
        return None, str(e)


def check_quantization(method: str, device: torch.device) -> None:
    """A clear error for a quantization the device cannot run."""
    if method not in QUANTIZATION_METHODS:
        raise ValueError(
            f"quantization must be one of {', '.join(QUANTIZATION_METHODS)}, got {method!r}"
        )
    if method == "fp8":
        if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
            raise ValueError("--quantization fp8 needs fp8 tensor cores (compute capability 8.9+)")
        if device.type == "cpu":
            log.warning("fp8 on CPU runs PyTorch's slow reference kernel: for checking, not speed")
        return
    if device.type != "cpu":
        raise ValueError(
            f"--quantization {method} uses CPU kernels; it is not available on {device}"
        )
    if method == "gguf" and _kernels_or_reason()[0] is None:
        raise ValueError(
            f"--quantization gguf needs inferd's C kernels, which cannot be built here: "
            f"{_kernels_or_reason()[1]}. Use --quantization int8 instead."
        )


def choose_scheme(quantization: str | None, dtype: str, checkpoint_format: str | None,
                  device: torch.device, tensor_parallel: int = 1,
                  dtype_origin: str | None = None, prequantized=None) -> WeightScheme:  # fmt: skip
    """The scheme of these flags for this checkpoint (`gguf`, `hf`, or None: not known yet,
    only the flags are checked) on this device. Raises ValueError naming the flag.
    `dtype_origin`: who set a non-auto `dtype`, when no flag did (a catalog entry).
    `prequantized`: an HF checkpoint's QuantFormat (its weights run as stored)."""
    resolved = resolve_dtype(dtype, device)
    if prequantized is not None:
        return _stored(prequantized, quantization, dtype, resolved, device, tensor_parallel)
    if quantization is not None:
        check_quantization(quantization, device)
        forced = f"chosen by --quantization {quantization}"
        if quantization == "gguf":
            if checkpoint_format not in ("gguf", None):
                raise ValueError("quantization gguf keeps a GGUF file's own blocks; the model "
                                 "is not a GGUF file")  # fmt: skip
            return _blocks(dtype, resolved, _kernels_or_reason()[0], forced)
        if dtype != "auto" and resolved != torch.bfloat16:
            raise ValueError(f"quantization {quantization} needs dtype bfloat16 (or auto)")
        return WeightScheme(quantization, torch.bfloat16, quantize=quantization, reason=forced)
    if dtype != "auto":
        return WeightScheme.dense(resolved, f"chosen by {dtype_origin or '--dtype ' + dtype}")
    if device.type != "cpu":
        return WeightScheme.dense(resolved, f"the default on {device.type}")
    if checkpoint_format != "gguf":
        return WeightScheme.dense(resolved, f"the default for {_checkpoint(checkpoint_format)} "
                                  f"on {_cpu()}")  # fmt: skip
    if tensor_parallel > 1:  # block layers are not split across ranks
        return WeightScheme.dense(resolved, "the default with tensor parallelism: GGUF blocks "
                                  "are not split across ranks")  # fmt: skip
    lib, reason = _kernels_or_reason()
    if lib is None:
        log.warning("inferd's C kernels are unavailable (%s): the GGUF weights are dequantised "
                    "to %s, which is slower", reason, _name(resolved))  # fmt: skip
        return WeightScheme.dense(resolved, "the default for a GGUF file without inferd's C "
                                  "kernels")  # fmt: skip
    return _blocks(dtype, resolved, lib, "the default for a GGUF file on a CPU with inferd's C "
                   "kernels")  # fmt: skip


def _stored(fmt, quantization: str | None, dtype: str, resolved: torch.dtype,
            device: torch.device, tensor_parallel: int) -> WeightScheme:  # fmt: skip
    """The scheme of a pre-quantised HF checkpoint: its weights as stored, or a clear refusal."""
    what = f"this checkpoint is already quantised ({fmt.describe()})"
    if quantization is not None:
        raise ValueError(f"{what}: --quantization {quantization} would quantise it again; "
                         "leave --quantization unset")  # fmt: skip
    if device.type != "cpu":
        raise ValueError(f"{what}: inferd runs {fmt.name} checkpoints with its CPU kernels, "
                         f"not on {device} yet; use a GGUF file or an unquantised checkpoint")
    if tensor_parallel > 1:
        raise ValueError(f"{what}: its layers are not split across tensor-parallel ranks")
    lib, reason = _kernels_or_reason()
    if lib is None:
        raise ValueError(f"{what}: running it needs inferd's C kernels, which cannot be built "
                         f"here: {reason}")  # fmt: skip
    held = torch.float32 if dtype == "auto" else resolved
    return WeightScheme(fmt.method, held, blocks=True, kernels=lib, stored=fmt,
                        reason=f"the checkpoint's quantization_config ({fmt.name})")


def _blocks(dtype: str, resolved: torch.dtype, lib, reason: str) -> WeightScheme:
    """The block scheme: with `--dtype auto` the file's floating-point tensors stay float32
    (whatever the CPU: nothing multiplies a large step in bf16 any more)."""
    return WeightScheme("gguf", torch.float32 if dtype == "auto" else resolved, blocks=True,
                        kernels=lib, reason=reason)  # fmt: skip


def deterministic_scheme(scheme: WeightScheme, device: torch.device,
                         tensor_parallel: int) -> WeightScheme:  # fmt: skip
    """`scheme` with --deterministic: each row's result independent of the rest of its step.
    Raises ValueError where that cannot hold."""
    if device.type != "cpu":
        raise ValueError(f"--deterministic runs on the CPU only (for now), not on {device}")
    if tensor_parallel > 1:
        raise ValueError("--deterministic does not hold with tensor parallelism: the "
                         "all-reduce sums a value in an order set by its place in the "
                         "step's buffer")  # fmt: skip
    if scheme.quantize in ("int4", "fp8"):
        raise ValueError(f"--deterministic does not hold with --quantization {scheme.quantize}: "
                         "its kernel's sums depend on the step's rows")  # fmt: skip
    lib, reason = _kernels_or_reason()
    if lib is None:
        raise ValueError(f"--deterministic needs inferd's C kernels, which cannot be built here: "
                         f"{reason}")  # fmt: skip
    return dataclasses.replace(scheme, deterministic=True, kernels=lib)


def _checkpoint(checkpoint_format: str | None) -> str:
    return "an HF checkpoint" if checkpoint_format == "hf" else "this checkpoint"


def _cpu() -> str:
    if cpu_info.cpu_has_fast_bf16():
        return "a CPU with fast bf16 (avx512_bf16 or AMX)"
    return "a CPU without fast bf16 (no avx512_bf16 or AMX)"

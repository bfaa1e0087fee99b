"""Build an architecture's module for a weight scheme and fill it from a checkpoint."""

from __future__ import annotations

import math

import torch

from inferd.distributed.state import SINGLE, TPGroup
from inferd.errors import ModelLoadError
from inferd.layers.weight_scheme import WeightScheme, choose_scheme
from inferd.loader import gguf_cache
from inferd.loader.checkpoint import Checkpoint
from inferd.loader.hf_dir import hf_tensor_shapes
from inferd.loader.hf_quantized import stored_weight_bytes
from inferd.models.base import CausalLM
from inferd.models.registry import model_class
from inferd.progress import status


def load_model(
    checkpoint: Checkpoint,
    dtype: torch.dtype,
    device: torch.device,
    quantization: str | None = None,
    tp: TPGroup = SINGLE,
    *,
    scheme: WeightScheme | None = None,
    weight_cache_size: int | None = None,
) -> CausalLM:
    """The checkpoint's model on `device`. `scheme` (chosen by the engine, `choose_scheme`)
    wins; without one, `dtype` and `quantization` force a mode, as the flags do.
    `weight_cache_size`: bytes the weight cache may hold (weight_cache.budget)."""
    if scheme is None:
        name = str(dtype).removeprefix("torch.")
        try:
            scheme = choose_scheme(quantization, name, checkpoint.format, device, tp.world_size,
                                   prequantized=checkpoint.quant)  # fmt: skip
        except ValueError as e:
            raise ModelLoadError(str(e)) from e
    if scheme.blocks and checkpoint.format != "gguf" and checkpoint.quant is None:
        raise ModelLoadError(f"{scheme.name} keeps a GGUF file's own quantisation; "
                             f"{checkpoint.path} is not a GGUF file")  # fmt: skip
    if device.type == "cpu":
        check_fits_in_memory(checkpoint, scheme)
    cls = model_class(checkpoint.config.architecture)
    # Parameters are created uninitialised on the target device, then overwritten by load.
    with torch.device(device):
        try:
            model = cls(checkpoint.config, scheme, tp)
        except ValueError as e:  # e.g. heads that do not divide among the ranks
            raise ModelLoadError(str(e)) from e
    if scheme.blocks and (checkpoint.gguf is not None or _cacheable(checkpoint)):
        gguf_cache.load_weights(model, checkpoint, tp, weight_cache_size)
    else:
        with torch.no_grad(), status(f"loading {checkpoint.path.name} ({scheme.name})"):
            model.load_weights(checkpoint.weights())
    return model.eval()


def _cacheable(checkpoint: Checkpoint) -> bool:
    """Whether a pre-quantised HF checkpoint's packed blocks can go to the weight cache: not
    GPTQ act-order (a layer's input order is not part of an entry) and not FP8 (its own
    kernel's layout, not blocks: read as stored at every start)."""
    fmt = checkpoint.quant
    return fmt is not None and not fmt.desc_act and fmt.method != "fp8"


def weights_bytes(checkpoint: Checkpoint, scheme: WeightScheme) -> int:
    """About what the model's weights take in memory under `scheme`: a GGUF file's packed
    blocks (gguf_cache.packed_bytes) plus its other tensors in the dense dtype, or every
    parameter in the dense dtype (int8/int4/fp8 quantise after loading them so)."""
    dense = torch.empty(0, dtype=scheme.dtype).element_size()
    if checkpoint.gguf is not None:
        packed = gguf_cache.packed_bytes(checkpoint) if scheme.blocks else 0
        rest = sum(math.prod(info.shape) for info in checkpoint.gguf.tensors.values()
                   if not (scheme.blocks and gguf_cache.is_packed(info)))  # fmt: skip
        return packed + rest * dense
    shapes = hf_tensor_shapes(checkpoint.path)
    if checkpoint.quant is not None:  # the quantised layers as held, the rest dense
        return stored_weight_bytes(shapes, checkpoint.quant, dense)
    return sum(math.prod(shape) for shape, _ in shapes.values()) * dense


def check_fits_in_memory(checkpoint: Checkpoint, scheme: WeightScheme) -> None:
    """Refuse, before anything is allocated, a model whose weights alone exceed the memory
    this machine has available (Linux's MemAvailable: free memory and reclaimable caches)."""
    available = available_memory()
    if available is None:
        return
    need = weights_bytes(checkpoint, scheme)
    if need > available:
        raise ModelLoadError(
            f"{checkpoint.path.name} needs about {need / 2**30:.1f} GiB for its weights "
            f"({scheme.name}), and this machine has {available / 2**30:.1f} GiB of memory "
            "available; free memory, or use a smaller file (a lower-bit GGUF quantisation)"
        )


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes; None where there is no such file."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None

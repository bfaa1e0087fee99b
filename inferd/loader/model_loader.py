"""Build an architecture's module and fill it from a checkpoint, tensor by tensor."""

from __future__ import annotations

import torch

from inferd.distributed.state import SINGLE, TPGroup
from inferd.errors import ModelLoadError
from inferd.layers.fused_decode import attach_fused_decode
from inferd.layers.quant import quantize_model
from inferd.loader import gguf_cache, weight_cache
from inferd.loader.checkpoint import Checkpoint
from inferd.models.base import CausalLM
from inferd.models.registry import model_class
from inferd.progress import status


def load_model(
    checkpoint: Checkpoint,
    dtype: torch.dtype,
    device: torch.device,
    quantization: str | None = None,
    tp: TPGroup = SINGLE,
) -> CausalLM:
    cls = model_class(checkpoint.config.architecture)
    # Parameters are created uninitialised on the target device, then overwritten by load.
    with torch.device(device):
        try:
            model = cls(checkpoint.config, dtype, tp)
        except ValueError as e:  # e.g. heads that do not divide among the ranks
            raise ModelLoadError(str(e)) from e
    if quantization == "gguf":
        if checkpoint.format != "gguf":
            raise ModelLoadError("--quantization gguf keeps a GGUF file's own quantisation; "
                                 f"{checkpoint.path} is not a GGUF file")  # fmt: skip
        model.keep_gguf_blocks()
        cache = None
        if weight_cache.enabled():
            cache = weight_cache.cache_path(checkpoint.path, dtype, tp.rank, tp.world_size,
                                            gguf_cache.VARIANT)  # fmt: skip
        if cache is None or not (cache.exists() and gguf_cache.load_into(model, cache)):
            with torch.no_grad(), status(f"packing {checkpoint.path.name}'s blocks"):
                model.load_weights(checkpoint.weights())
            if cache is not None:
                with status("caching the packed blocks"):
                    gguf_cache.save(model, cache)
        attach_fused_decode(model)
        return model.eval()
    cache = None
    if quantization is None and checkpoint.format == "gguf" and device.type == "cpu":
        if weight_cache.enabled():
            cache = weight_cache.cache_path(checkpoint.path, dtype, tp.rank, tp.world_size)
            if cache.exists() and weight_cache.load_into(model, cache):
                model.finalize()
                return model.eval()
    with torch.no_grad():
        with status(f"loading {checkpoint.path.name} as {str(dtype).removeprefix('torch.')}"):
            model.load_weights(checkpoint.weights())
        if cache is not None:
            with status("caching the converted weights"):
                weight_cache.save(model, cache)
        if quantization:
            with status(f"quantising the weights ({quantization})"):
                quantize_model(model, quantization)
    return model.eval()

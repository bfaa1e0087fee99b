"""Build an architecture's module and fill it from a checkpoint, tensor by tensor."""

from __future__ import annotations

import torch

from inferd.layers.quant import quantize_model
from inferd.loader.checkpoint import Checkpoint
from inferd.models.base import CausalLM
from inferd.models.registry import model_class


def load_model(
    checkpoint: Checkpoint,
    dtype: torch.dtype,
    device: torch.device,
    quantization: str | None = None,
) -> CausalLM:
    cls = model_class(checkpoint.config.architecture)
    # Parameters are created uninitialised on the target device, then overwritten by load.
    with torch.device(device):
        model = cls(checkpoint.config, dtype)
    with torch.no_grad():
        model.load_weights(checkpoint.weights(dtype))
        if quantization:
            quantize_model(model, quantization)
    return model.eval()

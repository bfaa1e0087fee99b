"""Build an architecture's module for a weight scheme and fill it from a checkpoint."""

from __future__ import annotations

import torch

from inferd.distributed.state import SINGLE, TPGroup
from inferd.errors import ModelLoadError
from inferd.layers.weight_scheme import WeightScheme, choose_scheme
from inferd.loader import gguf_cache
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
    *,
    scheme: WeightScheme | None = None,
) -> CausalLM:
    """The checkpoint's model on `device`. `scheme` (chosen by the engine, `choose_scheme`)
    wins; without one, `dtype` and `quantization` force a mode, as the flags do."""
    if scheme is None:
        name = str(dtype).removeprefix("torch.")
        try:
            scheme = choose_scheme(quantization, name, checkpoint.format, device, tp.world_size)
        except ValueError as e:
            raise ModelLoadError(str(e)) from e
    if scheme.blocks and checkpoint.format != "gguf":
        raise ModelLoadError(f"{scheme.name} keeps a GGUF file's own quantisation; "
                             f"{checkpoint.path} is not a GGUF file")  # fmt: skip
    cls = model_class(checkpoint.config.architecture)
    # Parameters are created uninitialised on the target device, then overwritten by load.
    with torch.device(device):
        try:
            model = cls(checkpoint.config, scheme, tp)
        except ValueError as e:  # e.g. heads that do not divide among the ranks
            raise ModelLoadError(str(e)) from e
    if scheme.blocks:
        gguf_cache.load_weights(model, checkpoint, tp)
    else:
        with torch.no_grad(), status(f"loading {checkpoint.path.name} ({scheme.name})"):
            model.load_weights(checkpoint.weights())
    return model.eval()

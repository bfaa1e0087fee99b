"""A checkpoint's config must describe the tensors it stores.

The model's parameters are allocated from the config before a single tensor is read, so a
config that lies (a hidden size of two billion, a million layers) would make inferd allocate
whatever it claims. Checking the config's sizes against the stored tensor shapes (read from
the file headers, nothing loaded) bounds every allocation by what the file really holds, and
turns a mismatch into one clear error instead of a failed allocation or a shape error halfway
through loading.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from inferd.config import ModelConfig
from inferd.errors import ModelLoadError
from inferd.models.registry import architecture

EMBEDDING = "model.embed_tokens.weight"
_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def check_config_matches_tensors(
    config: ModelConfig, shapes: Mapping[str, tuple[int, ...]], source: str | Path
) -> None:
    """Raise ModelLoadError when the config's sizes disagree with the stored tensors. `shapes`
    maps HF tensor names (as tensor_layout.py normalises them) to shapes; an empty mapping (a
    folder with only config.json, which `inferd memory` accepts) checks nothing. What each
    layer must hold is the family's Architecture record's `layer_tensors`."""
    if not shapes:
        return

    def expect(name: str, shape: tuple[int, ...]) -> None:
        stored = tuple(shapes[name])
        if stored != shape:
            raise ModelLoadError(
                f"{source}: tensor {name} has shape {stored}, but the config describes "
                f"{shape} (config and weights disagree)"
            )

    if EMBEDDING not in shapes:
        raise ModelLoadError(f"{source}: the checkpoint has no {EMBEDDING} tensor")
    expect(EMBEDDING, (config.vocab_size, config.hidden_size))
    if "lm_head.weight" in shapes:
        expect("lm_head.weight", (config.vocab_size, config.hidden_size))
    layers = {int(m.group(1)) for name in shapes if (m := _LAYER.match(name))}
    # NOTE: compared without building range(num_layers): the count comes from the config.
    if len(layers) != config.num_layers or (layers and max(layers) != config.num_layers - 1):
        stored = f"layers 0 to {max(layers)}" if layers else "no layers"
        if layers and len(layers) != max(layers) + 1:
            stored = f"{len(layers)} layers numbered up to {max(layers)}"
        raise ModelLoadError(
            f"{source}: the config has {config.num_layers} layers, the checkpoint stores {stored}"
        )
    record = architecture(config.architecture)
    for layer in range(config.num_layers):
        for sub, shape in record.layer_tensors(config, layer).items():
            name = f"model.layers.{layer}.{sub}"
            if name not in shapes:
                raise ModelLoadError(f"{source}: the checkpoint has no {name} tensor")
            expect(name, shape)
    for name, shape in record.model_tensors(config).items():
        if name not in shapes:
            raise ModelLoadError(f"{source}: the checkpoint has no {name} tensor")
        expect(name, shape)

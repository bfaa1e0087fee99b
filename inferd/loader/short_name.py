"""A short name of the catalog (loader/catalog.py) → the model file in the cache, the embedded
default assembled on first use (default_model.py). Apart from the catalog because the default
model's assembly builds on the catalog's record and checks."""

from __future__ import annotations

from pathlib import Path

from inferd.errors import ModelLoadError
from inferd.loader.catalog import lookup, models_dir, verify_file
from inferd.loader.default_model import default_model_path


def resolve(name: str) -> Path | None:
    """The cached file of a short name; None when `name` is not a short name. A known name
    that was not pulled yet is an error that says how to pull it."""
    model = lookup(name)
    if model is None:
        return None
    if model.embedded:
        return default_model_path()
    if not verify_file(model):
        raise ModelLoadError(
            f"model {model.name!r} is not in the cache ({models_dir()}), or its file was "
            f"damaged; fetch it with: inferd pull {model.name}"
        )
    return model.path

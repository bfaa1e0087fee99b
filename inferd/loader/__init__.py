"""Model sources: GGUF files, HF safetensors folders and the embedded default model.

`architecture(name)` is a family's Architecture record (inferd/models/registry.py), for the
layers above the loader that need a family's defaults (chat and tool formats)."""

from inferd.loader.checkpoint import Checkpoint, open_checkpoint
from inferd.loader.model_loader import load_model
from inferd.models.registry import architecture

__all__ = ["Checkpoint", "architecture", "load_model", "open_checkpoint"]

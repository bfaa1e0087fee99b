"""Model sources: GGUF files, HF safetensors folders and the embedded default model."""

from inferd.loader.checkpoint import Checkpoint, open_checkpoint
from inferd.loader.model_loader import load_model

__all__ = ["Checkpoint", "load_model", "open_checkpoint"]

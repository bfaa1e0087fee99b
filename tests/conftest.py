"""Shared fixtures. The HF transformers references are expensive (the embedded model takes ~45 s
to load through transformers), so each is built once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """The embedded model file (assembled into the cache on first use)."""
    from inferd.loader.default_model import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def hf_gemma_tokenizer(gemma_gguf):
    """HF transformers' tokenizer converted from the same GGUF file (the reference)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gemma_gguf.parent), gguf_file=gemma_gguf.name)

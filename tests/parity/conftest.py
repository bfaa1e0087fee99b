"""Fixtures for the parity tests (the session-wide references live in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def gemma_tokenizer(gemma_gguf):
    """inferd's tokenizer of the embedded model (from the tokenizer cache after the first run)."""
    from inferd.loader.gguf_file import GGUFFile
    from inferd.tokenizer import Tokenizer

    return Tokenizer.from_gguf(GGUFFile(gemma_gguf))


@pytest.fixture(scope="session")
def hf_gemma_reference(gemma_gguf):
    """HF transformers' stored outputs on the embedded model: (JSON, tensors), checked to be of
    this GGUF file (gemma_reference.py; scripts/gemma_hf_reference.py regenerates them)."""
    from gemma_reference import load

    return load(gemma_gguf)

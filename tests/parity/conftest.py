"""Fixtures for the parity tests (the session-wide references live in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def gemma_tokenizer(gemma_gguf):
    """inferd's tokenizer of the embedded model (from the tokenizer cache after the first run)."""
    from inferd.loader.gguf_file import GGUFFile
    from inferd.tokenizer import Tokenizer

    return Tokenizer.from_gguf(GGUFFile(gemma_gguf))

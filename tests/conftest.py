"""Shared fixtures: the embedded model's engines, built once per test session. HF transformers'
outputs on the embedded model (~45 s to load through transformers) are stored:
tests/parity/gemma_reference.py."""

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
def gemma_llm():
    """inferd's offline engine on the embedded model in the HF parity mode (float32 weights,
    pure PyTorch attention), shared by the engine and parity tests."""
    from inferd import LLM

    return LLM(dtype="float32", attention_backend="torch", kv_cache_memory=512 << 20,
               max_num_batched_tokens=512)  # fmt: skip


@pytest.fixture(scope="session")
def default_llm(c_kernels):
    """inferd's offline engine on the embedded model in the default mode (the GGUF blocks with
    inferd's C kernels: one C call for all decoder layers at every step), shared by the tests of
    that mode."""
    from inferd import LLM

    llm = LLM(kv_cache_memory=256 << 20, max_num_batched_tokens=512)
    assert llm.engine.runner.model.cpu_decoder is not None, "the default mode on a GGUF file"
    return llm


@pytest.fixture(scope="session")
def c_kernels():
    """inferd's C kernels (compiled on first use). Without a C compiler the gguf mode is not
    available, and its end-to-end tests skip, saying so."""
    from inferd.cpu_kernels import build

    try:
        return build.kernel_library()
    except build.KernelsUnavailable as e:
        pytest.skip(f"inferd's C kernels cannot be built here: {e}")

"""Which Architecture record (models/architecture.py) reads which checkpoint: one model file per
family, each defining `ARCHITECTURE`; HF `architectures` class names and GGUF
`general.architecture` names both lead to a record.

A new family is a model file and its name in FAMILIES, nothing else.
"""

from __future__ import annotations

import importlib
from functools import cache
from types import MappingProxyType

from inferd.errors import ModelLoadError
from inferd.models.architecture import Architecture

# Model files (inferd/models/<name>.py), each with an ARCHITECTURE record.
FAMILIES = (
    "llama", "mistral", "phi3", "qwen2", "qwen3", "gemma3",
    "qwen2_moe", "qwen3_moe", "olmoe", "mixtral", "gemma2", "granite", "olmo2",
    "gpt_oss", "llava",
)  # fmt: skip


@cache
def records() -> MappingProxyType:
    """record name → record, every family's (imported once, on first use)."""
    out: dict[str, Architecture] = {}
    for family in FAMILIES:
        record = importlib.import_module(f"inferd.models.{family}").ARCHITECTURE
        if record.name in out:
            raise AssertionError(f"two model files define the architecture {record.name!r}")
        out[record.name] = record
    return MappingProxyType(out)


def architecture(name: str) -> Architecture:
    """The record of `ModelConfig.architecture` `name`."""
    record = records().get(name)
    if record is None:
        raise ModelLoadError(f"unsupported architecture {name!r}; inferd knows: "
                             f"{', '.join(sorted(records()))}")  # fmt: skip
    return record


def for_hf_classes(classes: list[str]) -> Architecture | None:
    """The record of the first of config.json's `architectures` inferd reads, or None."""
    for cls in classes:
        for record in records().values():
            if cls in record.hf_classes:
                return record
    return None


def for_gguf(name: str, moe: bool) -> Architecture | None:
    """The record of a GGUF `general.architecture`; `moe`: the file holds expert routers (one
    GGUF name can cover a dense family and its Mixture-of-Experts sibling: llama, Mixtral)."""
    matches = [r for r in records().values() if name in r.gguf_names]
    return next((r for r in matches if r.moe == moe), None)


def supported_architectures() -> list[str]:
    """HF class names inferd reads."""
    return sorted(c for r in records().values() for c in r.hf_classes)


def supported_gguf_architectures() -> list[str]:
    return sorted({n for r in records().values() for n in r.gguf_names})


def model_class(name: str) -> type:
    return architecture(name).model_class

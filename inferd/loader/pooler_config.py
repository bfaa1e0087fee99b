"""What a checkpoint's files say about its embeddings (inferd/pooling_params.py `PoolerConfig`).

    HF folder   a sentence-transformers layout: modules.json lists the modules applied after
                the transformer; its Pooling module's config.json names the pooling
                (pooling_mode_lasttoken / _mean_tokens / _cls_token), a Normalize module means
                unit-length output. config.json's `is_matryoshka` / `matryoshka_dimensions`
                (vLLM's keys) allow shorter embeddings.
    GGUF file   llama.cpp's `{arch}.pooling_type` (1 mean, 2 cls, 3 last).
    neither     last-token pooling, normalised: vLLM's default for a decoder model.

`--pooler-config` (EngineConfig.pooler_config) overrides any of these fields. A module inferd
does not compute (a Dense projection, max pooling) makes the model's embeddings `unsupported`,
with the reason, rather than silently different from the model's own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inferd.loader.checkpoint import Checkpoint
from inferd.pooling_params import PoolerConfig, pooler_overrides

_ST = "sentence_transformers.models."
# sentence-transformers' Pooling config keys → inferd's pooling type (None: not computed here).
_ST_MODES = {
    "pooling_mode_lasttoken": "last",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": None,
    "pooling_mode_mean_sqrt_len_tokens": None,
    "pooling_mode_weightedmean_tokens": None,
}
_GGUF_POOLING = {1: "mean", 2: "cls", 3: "last"}  # llama.cpp's LLAMA_POOLING_TYPE_*


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _sentence_transformers(folder: Path) -> dict[str, Any]:
    """The fields modules.json and its Pooling module's config set; {} without modules.json."""
    modules = _json(folder / "modules.json")
    if not isinstance(modules, list):
        return {}
    fields: dict[str, Any] = {"source": f"{folder.name}/modules.json", "normalize": False}
    others = []
    for module in modules:
        kind = str(module.get("type", "")) if isinstance(module, dict) else ""
        name = kind.removeprefix(_ST)
        if name == "Transformer":
            continue
        if name == "Normalize":
            fields["normalize"] = True
        elif name == "Pooling":
            path = folder / str(module.get("path", "")) / "config.json"
            config = _json(path)
            if not isinstance(config, dict):
                others.append(f"a Pooling module without a readable {path.name}")
                continue
            chosen = [key for key in _ST_MODES if config.get(key) is True]
            if len(chosen) != 1 or _ST_MODES[chosen[0]] is None:
                others.append(f"Pooling with {', '.join(chosen) or 'no mode'}")
            else:
                fields["pooling_type"] = _ST_MODES[chosen[0]]
                fields["source"] = f"{folder.name}/{module.get('path')}/config.json"
        else:
            others.append(kind or repr(module))
    if others:
        fields["unsupported"] = (f"its sentence-transformers modules include {'; '.join(others)}, "
                                 "which inferd does not compute")  # fmt: skip
    return fields


def _matryoshka(config: Any) -> dict[str, Any]:
    if not isinstance(config, dict):
        return {}
    fields: dict[str, Any] = {}
    if config.get("is_matryoshka") is True:
        fields["is_matryoshka"] = True
    dims = config.get("matryoshka_dimensions")
    if isinstance(dims, list) and dims and all(isinstance(d, int) and d >= 1 for d in dims):
        fields["matryoshka_dimensions"] = tuple(dims)
    return fields


def pooler_config(checkpoint: Checkpoint, overrides: Any = None) -> PoolerConfig:
    """The checkpoint's PoolerConfig, with `overrides` (EngineConfig.pooler_config) on top."""
    fields: dict[str, Any] = {}
    if checkpoint.format == "hf":
        fields.update(_matryoshka(_json(checkpoint.path / "config.json")))
        fields.update(_sentence_transformers(checkpoint.path))
    elif checkpoint.gguf is not None:
        key = f"{checkpoint.gguf.architecture}.pooling_type"
        kind = checkpoint.gguf.get(key)
        if kind in _GGUF_POOLING:
            fields["pooling_type"] = _GGUF_POOLING[kind]
            fields["source"] = f"{checkpoint.path.name} ({key})"
        elif kind not in (None, 0):
            fields["unsupported"] = f"its GGUF pooling_type {kind} is not last, mean or cls"
    hidden = checkpoint.config.hidden_size
    if "matryoshka_dimensions" in fields:  # a file's sizes past the model's own mean nothing
        kept = tuple(d for d in fields["matryoshka_dimensions"] if d <= hidden)
        fields["matryoshka_dimensions"] = kept
    chosen = pooler_overrides(overrides)
    too_long = [d for d in chosen.get("matryoshka_dimensions", ()) if d > hidden]
    if too_long:
        raise ValueError(f"--pooler-config matryoshka_dimensions {too_long} exceed the model's "
                         f"embedding size {hidden}")  # fmt: skip
    if chosen:
        fields.update(chosen, source="--pooler-config")
    return PoolerConfig(hidden, **fields)

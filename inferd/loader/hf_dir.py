"""An HF checkpoint folder: config.json plus single or sharded *.safetensors, memory-mapped and
read tensor by tensor. Pickle checkpoints are refused: loading one can run arbitrary code.
Every file is untrusted: the shard index may only name files inside the folder, and each
shard's header is checked (safetensors_header.py) before the library maps it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from inferd.errors import ModelLoadError
from inferd.loader.safetensors_header import read_safetensors_header

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
INDEX_FILE = "model.safetensors.index.json"


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: cannot read JSON ({e})") from e


def safetensors_files(folder: Path) -> list[Path]:
    """The checkpoint's shards, from the index when there is one."""
    index = folder / INDEX_FILE
    if index.exists():
        files = sorted({folder / name for name in _index_shards(index)})
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise ModelLoadError(f"{folder}: shards listed in {INDEX_FILE} are missing: {missing}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise ModelLoadError(pickle_refusal(folder / pickles[0]))
    return files


def _index_shards(index: Path) -> set[str]:
    """Shard file names the index's weight_map names: plain names of files in the folder (an
    index naming "../x" or "/etc/x" would make inferd read files outside the checkpoint)."""
    doc = read_json(index)
    weight_map = doc.get("weight_map", {}) if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        raise ModelLoadError(f"{index}: weight_map must be an object (tensor name → file name)")
    names = set()
    for tensor, name in weight_map.items():
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise ModelLoadError(
                f"{index}: weight_map entry {tensor!r} must name a file in the folder, got {name!r}"
            )
        names.add(name)
    return names


def pickle_refusal(path: Path) -> str:
    return (
        f"{path}: pickle checkpoints ({', '.join(PICKLE_SUFFIXES)}) are refused, because "
        "unpickling can execute arbitrary code; convert the model to safetensors "
        "(e.g. save_pretrained(..., safe_serialization=True)) or use a GGUF file"
    )


class HFWeight:
    """One tensor of a safetensors file; `load` reads only the requested rows/columns. With
    `index`, the tensor is one slice of a stacked 3-D tensor (an expert's matrix)."""

    def __init__(self, file: Path, handle, name: str, index: int | None = None):
        self.file, self.handle, self.name, self.index = file, handle, name, index
        shape = tuple(handle.get_slice(name).get_shape())
        self.shape = shape if index is None else shape[1:]

    def expert(self, index: int) -> HFWeight:
        """Matrix `index` of a 3-D tensor [experts, rows, cols], read on its own."""
        return HFWeight(self.file, self.handle, self.name, index)

    def load(self, dtype: torch.dtype, rows=None, cols=None) -> torch.Tensor:
        try:
            sl = self.handle.get_slice(self.name)
            lead = () if self.index is None else (self.index,)
            r = slice(rows[0], rows[0] + rows[1]) if rows else slice(None)
            if cols is None:
                t = sl[(*lead, r)]
            else:
                t = sl[(*lead, r, slice(cols[0], cols[0] + cols[1]))]
        except Exception as e:  # safetensors raises its own error type for malformed files
            reason = " ".join(str(e).split())  # one line, whatever the library wrote
            raise ModelLoadError(f"{self.file}: cannot read tensor {self.name!r} ({reason})") from e
        return t.to(dtype)


def hf_weights(folder: Path) -> Iterator[tuple[str, HFWeight]]:
    files = safetensors_files(folder)
    if not files:
        raise ModelLoadError(f"{folder}: no *.safetensors weights in the folder")
    for file in files:
        read_safetensors_header(file)  # a clear error for a damaged or crafted header
        try:
            handle = safe_open(str(file), framework="pt")
            names = list(handle.keys())
        except Exception as e:  # safetensors raises its own error type for malformed files
            reason = " ".join(str(e).split())
            raise ModelLoadError(f"{file}: cannot read safetensors file ({reason})") from e
        for name in names:
            yield name, HFWeight(file, handle, name)


def hf_tensor_shapes(folder: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name → (shape, dtype) from the safetensors headers alone (nothing is loaded)."""
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    where: dict[str, Path] = {}
    for file in safetensors_files(folder):
        for name, info in read_safetensors_header(file).items():
            if name in where:
                raise ModelLoadError(
                    f"{folder}: tensor {name!r} is stored twice ({where[name].name}, {file.name})"
                )
            out[name], where[name] = info, file
    return out

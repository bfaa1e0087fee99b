"""Cache of converted weights, for a fast warm start from quantised GGUF files.

Dequantising a GGUF file costs most of a cold start (0.7 s of 2.8 s for the embedded model here).
After the first load, the model's tensors are written once, in the run dtype, as one safetensors
file under `$INFERD_CACHE/weights/`; later starts map that file copy-on-write and point the
parameters straight at it: no copy, pages come from the OS page cache as they are first used.

The key covers everything the converted tensors depend on: the source file (path, size, mtime),
the dtype, the tensor-parallel rank, inferd's and torch's versions. Only unquantised models are
cached (quantised ones also hold integer kernels). `INFERD_WEIGHT_CACHE=0` turns it off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import struct
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_FORMAT = 1
_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
_NAMES = {v: k for k, v in _DTYPES.items()}
_KEEP = 4  # cached models kept; older ones are removed


def enabled() -> bool:
    return os.environ.get("INFERD_WEIGHT_CACHE", "1") not in ("0", "false", "no")


def cache_path(source: Path, dtype: torch.dtype, rank: int, world: int, variant: str = "") -> Path:
    """`variant`: what else the cached tensors depend on (the gguf mode's block layout)."""
    from inferd.cache import cache_dir
    from inferd.version import __version__

    st = source.stat()
    ident = f"{_FORMAT}|{source.resolve()}|{st.st_size}|{st.st_mtime_ns}|{dtype}|{rank}/{world}"
    ident += f"|{variant}"
    ident += f"|{__version__}|{torch.__version__}"
    return (
        cache_dir() / "weights" / f"{hashlib.sha256(ident.encode()).hexdigest()[:32]}.safetensors"
    )


def _tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers, each storage once (a tied LM head is the embedding)."""
    out, seen = {}, set()
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        key = (t.data_ptr(), t.shape)
        if key not in seen:
            seen.add(key)
            out[name] = t
    return out


def save(model: torch.nn.Module, path: Path) -> None:
    from safetensors.torch import save_file

    tensors = {n: t.detach().contiguous() for n, t in _tensors(model).items()}
    if any(t.dtype not in _NAMES for t in tensors.values()):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".part", delete=False) as tmp:
            tmp_path = Path(tmp.name)
        save_file(tensors, str(tmp_path))
        os.replace(tmp_path, path)
    except OSError as e:  # a full or read-only disk only costs start-up time
        log.warning("could not cache converted weights at %s: %s", path, e)
        return
    evict_old(path.parent)


def evict_old(directory: Path) -> None:
    """Keep the `_KEEP` most recently written cache files."""
    old = sorted(directory.glob("*.safetensors"), key=lambda p: p.stat().st_mtime)
    for stale in old[:-_KEEP]:
        stale.unlink(missing_ok=True)


def load_into(model: torch.nn.Module, path: Path) -> bool:
    """Point the model's tensors at the cached file. False when the cache does not fit."""
    try:
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError):
        return False
    (header_len,) = struct.unpack_from("<Q", mapped, 0)
    header = json.loads(mapped[8 : 8 + header_len])
    base = 8 + header_len
    targets = _tensors(model)
    if set(targets) != {k for k in header if k != "__metadata__"}:
        return False
    for name, t in targets.items():
        info = header[name]
        start, end = info["data_offsets"]
        dtype = _DTYPES.get(info["dtype"])
        if dtype != t.dtype or list(t.shape) != info["shape"]:
            return False
        view = torch.frombuffer(mapped, dtype=dtype, count=(end - start) // t.element_size(),
                                offset=base + start).view(t.shape)  # fmt: skip
        t.data = view
    model._weight_cache_mmap = mapped  # keep the mapping alive as long as the model
    return True

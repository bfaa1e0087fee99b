"""Entries of converted weights under `cache_dir()/weights/`, for a fast warm start.

Layout: one entry per (source model file, mode of conversion, tensor-parallel rank):

    weights/<key>.safetensors   the tensors, mapped copy-on-write at load (no copy is made;
                                pages come from the OS page cache as they are first used)
    weights/<key>.json          what the entry is, for people and for `inferd cache`:
                                {"model", "name", "mode", "bytes", "source_bytes", "rank",
                                 "world", "created", "inferd", "torch", "checksum"}

`<key>` hashes everything the tensors depend on: the source file (path, size, mtime), the mode
and its layout version, the rank, inferd's and torch's versions; an entry that no longer fits
is never read again. `checksum` (inferd/cache.py: size and CRC-32 of the .safetensors file) is
checked every time the entry is mapped (`start_checking` lets that run in a thread beside other
start-up work, such as the tokenizer's loading): a damaged entry (random bytes, truncation, a broken
header, a missing or unreadable description) is logged with its path, deleted and rebuilt, never
loaded. Writing an entry removes the other entries of the same model, mode and
rank (one copy per model and mode) and the oldest entries beyond `KEEP`.
The only mode today is `gguf-blocks` (loader/gguf_cache.py): a GGUF file's packed blocks,
about the file's size. Dense copies (bf16, let alone float32) of a quantised file are never
written: modes that need them dequantise at load. `INFERD_WEIGHT_CACHE=0` turns caching off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import struct
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from inferd.cache import checksum_of, checksum_of_buffer, discard, write_text_atomically

log = logging.getLogger(__name__)

_FORMAT = 4  # 3: entries carry a checksum; 4: block parts in groups of 16 rows (block_gemv.c)
KEEP = 4  # entries kept; older ones are removed


@dataclass(frozen=True)
class CacheEntry:
    path: Path  # the .safetensors file
    info: dict  # its .json description

    @property
    def bytes(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0


def enabled() -> bool:
    return os.environ.get("INFERD_WEIGHT_CACHE", "1") not in ("0", "false", "no")


def directory() -> Path:
    from inferd.cache import cache_dir

    return cache_dir() / "weights"


def entry_path(source: Path, mode: str, rank: int, world: int) -> Path:
    """The .safetensors path of the entry of `source` converted by `mode` (which names its
    layout version) for this rank."""
    from inferd.version import __version__

    st = source.stat()
    ident = (f"{_FORMAT}|{source.resolve()}|{st.st_size}|{st.st_mtime_ns}|{mode}|{rank}/{world}"
             f"|{__version__}|{torch.__version__}")  # fmt: skip
    return directory() / f"{hashlib.sha256(ident.encode()).hexdigest()[:32]}.safetensors"


def write_entry(path: Path, tensors: dict[str, torch.Tensor], header: dict[str, str],
                info: dict) -> bool:  # fmt: skip
    """Write the tensors (with `header` as safetensors metadata) and the JSON description
    beside them, each atomically. A full or read-only disk only costs start-up time: it is
    logged and False returned."""
    from safetensors.torch import save_file

    from inferd.version import __version__

    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".part", delete=False) as tmp:
            tmp_path = Path(tmp.name)
        save_file(tensors, str(tmp_path), metadata=header)
        description = {**info, "bytes": tmp_path.stat().st_size,
                       "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "inferd": __version__, "torch": torch.__version__,
                       "checksum": checksum_of(tmp_path)}  # fmt: skip
        # NOTE: the description (with the checksum) goes first: a reader never finds the new
        # tensors beside a stale checksum (an entry's bytes are a function of its key).
        write_text_atomically(path.with_suffix(".json"), json.dumps(description, indent=1) + "\n")
        os.replace(tmp_path, path)
    except OSError as e:
        log.warning("could not cache converted weights at %s: %s", path, e)
        return False
    same = ("model", "mode", "rank", "world")
    for other in entries(path.parent):
        if other.path != path and all(other.info.get(k) == info.get(k) for k in same):
            remove(other)  # an earlier conversion of the same model (older file or version)
    evict_old(path.parent)
    return True


def entries(where: Path | None = None) -> list[CacheEntry]:
    """Every complete entry, oldest first."""
    where = where or directory()
    found = []
    for path in sorted(where.glob("*.safetensors"), key=lambda p: p.stat().st_mtime):
        try:
            info = json.loads(path.with_suffix(".json").read_text())
        except (OSError, ValueError):
            continue
        found.append(CacheEntry(path, info))
    return found


def remove(entry: CacheEntry) -> None:
    entry.path.unlink(missing_ok=True)
    entry.path.with_suffix(".json").unlink(missing_ok=True)


def evict_old(where: Path) -> None:
    """Keep the `KEEP` newest entries. Files of earlier versions (a .safetensors without its
    .json: dense copies, some of them float32) are removed too."""
    for path in where.glob("*.safetensors"):
        if not path.with_suffix(".json").exists():
            path.unlink(missing_ok=True)
    for stale in entries(where)[:-KEEP]:
        remove(stale)


class _Check:
    """An entry mapped, and its checksum being computed by a thread."""

    def __init__(self, mapped: mmap.mmap):
        self.mapped, self._result = mapped, ""
        self._thread = threading.Thread(target=self._run, name="inferd-cache-check", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self._result = checksum_of_buffer(self.mapped)  # without Python's lock (cache.py)

    def result(self) -> str:
        self._thread.join()
        return self._result


_checks: dict[Path, _Check] = {}


def start_checking(path: Path) -> None:
    """Map the entry at `path` and start computing its checksum in a thread; `map_entry` then
    takes the mapping and waits for the result. Nothing happens without an entry, and any error
    is left for `map_entry` to report."""
    if path in _checks or not path.is_file():
        return
    try:
        _checks[path] = _Check(_map(path))
    except (OSError, ValueError):
        pass


def stop_checking(path: Path) -> None:
    """Forget the check `start_checking` began for `path` (its thread finished, its mapping
    closed), if there is one."""
    check = _checks.pop(path, None)
    if check is not None:
        check.result()
        check.mapped.close()


def _map(path: Path) -> mmap.mmap:
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)


def map_entry(path: Path) -> tuple[mmap.mmap, dict, int] | None:
    """(copy-on-write mapping, safetensors header, offset of the data), or None when there is
    no entry or it is damaged (then logged, deleted: the caller rebuilds it)."""
    check = _checks.pop(path, None)
    if not path.is_file():
        return None
    description = path.with_suffix(".json")
    try:
        expected = json.loads(description.read_text())["checksum"]
        mapped = check.mapped if check is not None else _map(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        discard(path, f"unreadable or without a checksum: {e}", also=(description,))
        return None
    actual = check.result() if check is not None else checksum_of_buffer(mapped)
    if actual != expected:
        mapped.close()
        discard(path, f"checksum {actual}, expected {expected}", also=(description,))
        return None
    try:
        (header_len,) = struct.unpack_from("<Q", mapped, 0)
        header = json.loads(mapped[8 : 8 + header_len])
    except (ValueError, struct.error) as e:  # intact, yet not safetensors: a foreign file
        discard(path, f"not a safetensors file: {e}", also=(description,))
        return None
    return mapped, header, 8 + header_len

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
loaded. Writing an entry removes the other entries of the same model, mode and rank (one copy
per model and mode), and the least recently used entries while all of them together exceed the
cache's size (`--weight-cache-size`, `INFERD_WEIGHT_CACHE_SIZE`; `budget()`): an entry that
would not fit on its own, or on the disk, is not written (the model runs from its file).
An entry is written a tensor at a time (`EntryWriter`), so writing one never holds a second
copy of the weights in memory.
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
import shutil
import struct
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from inferd.cache import checksum_of, checksum_of_buffer, discard, write_text_atomically
from inferd.sizes import parse_size

log = logging.getLogger(__name__)

# 3: entries carry a checksum; 4: block parts in groups of 16 rows (block_gemv.c); 5: 6-bit q,
# codebook indexes and factored scales (gguf_blocks.py)
_FORMAT = 5
DEFAULT_BUDGET = 32 << 30  # bytes of entries kept, unless set otherwise
_DTYPE_NAMES = {torch.uint8: "U8", torch.int8: "I8", torch.float16: "F16",
                torch.float32: "F32", torch.bfloat16: "BF16"}  # fmt: skip


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

    size, mtime = source_identity(source)
    ident = (f"{_FORMAT}|{source.resolve()}|{size}|{mtime}|{mode}|{rank}/{world}"
             f"|{__version__}|{torch.__version__}")  # fmt: skip
    return directory() / f"{hashlib.sha256(ident.encode()).hexdigest()[:32]}.safetensors"


def source_identity(source: Path) -> tuple[int, int]:
    """(bytes, latest mtime) of a GGUF file, or of an HF folder's config and weight files (a
    pre-quantised checkpoint: any of them changing makes a new entry)."""
    if not source.is_dir():
        st = source.stat()
        return st.st_size, st.st_mtime_ns
    files = [source / "config.json", *sorted(source.glob("*.safetensors"))]
    stats = [f.stat() for f in files if f.exists()]
    return sum(st.st_size for st in stats), max(st.st_mtime_ns for st in stats)


def budget(configured: int | None = None) -> int:
    """Bytes the weight cache may hold: `configured` (the --weight-cache-size flag), else
    INFERD_WEIGHT_CACHE_SIZE, else DEFAULT_BUDGET. 0: nothing is written."""
    if configured is not None:
        return configured
    text = os.environ.get("INFERD_WEIGHT_CACHE_SIZE")
    if not text:
        return DEFAULT_BUDGET
    try:
        return parse_size(text)
    except ValueError as e:
        raise ValueError(f"INFERD_WEIGHT_CACHE_SIZE: {e}") from None


def room_for(nbytes: int, where: Path, cache_bytes: int) -> str | None:
    """Make room for an entry of about `nbytes` among the entries in `where` (removing the
    least recently used while the cache would exceed `cache_bytes`); None when it fits, else
    why it cannot be written (the cache's size, or the disk's free space)."""
    if nbytes > cache_bytes:
        return (f"its {nbytes / 2**30:.2f} GiB exceed the weight cache's size of "
                f"{cache_bytes / 2**30:.2f} GiB (--weight-cache-size)")  # fmt: skip
    where.mkdir(parents=True, exist_ok=True)
    evict_old(where, cache_bytes - nbytes)
    free = shutil.disk_usage(where).free
    if nbytes + (256 << 20) > free:  # and a margin: the disk is not ours alone
        return f"the disk holding {where} has {free / 2**30:.2f} GiB free"
    return None


class EntryWriter:
    """An entry written a tensor at a time, in safetensors' layout (8 bytes of header length,
    the JSON header, then the tensors' bytes back to back). The header goes last, into room
    kept for it at the start and padded with spaces (which JSON ignores), so that the caller
    can free each tensor once it is written. Methods raise OSError (a full or read-only
    disk); `abort` then removes what was written."""

    def __init__(self, path: Path, header_room: int):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=path.parent, suffix=".part")
        self.path, self.tmp = path, Path(name)
        self.file = os.fdopen(fd, "wb")
        self.room = -(-header_room // 8) * 8  # the data starts 8-byte aligned
        self.tensors: dict[str, dict] = {}
        self.size = 0  # bytes of tensor data so far
        self.file.seek(8 + self.room)

    def write(self, key: str, tensor: torch.Tensor) -> None:
        t = tensor.contiguous()
        n = t.numel() * t.element_size()
        self.file.write(memoryview(t.view(torch.uint8).reshape(-1).numpy()))
        self.tensors[key] = {"dtype": _DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                             "data_offsets": [self.size, self.size + n]}  # fmt: skip
        self.size += n

    def commit(self, metadata: dict[str, str], info: dict, cache_bytes: int) -> None:
        """Write the header, then publish the entry with its description (the checksum
        first), then keep the cache within `cache_bytes`."""
        from inferd.version import __version__

        header = json.dumps({"__metadata__": metadata, **self.tensors}).encode()
        if len(header) > self.room:
            raise OSError(f"the header needs {len(header)} bytes, {self.room} were kept")
        self.file.seek(0)
        self.file.write(struct.pack("<Q", self.room) + header + b" " * (self.room - len(header)))
        self.file.close()
        description = {**info, "bytes": self.tmp.stat().st_size,
                       "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "inferd": __version__, "torch": torch.__version__,
                       "checksum": checksum_of(self.tmp)}  # fmt: skip
        # NOTE: the description (with the checksum) goes first: a reader never finds the new
        # tensors beside a stale checksum (an entry's bytes are a function of its key).
        write_text_atomically(self.path.with_suffix(".json"),
                              json.dumps(description, indent=1) + "\n")  # fmt: skip
        os.replace(self.tmp, self.path)
        same = ("model", "mode", "rank", "world")
        for other in entries(self.path.parent):
            if other.path != self.path and all(other.info.get(k) == info.get(k) for k in same):
                remove(other)  # an earlier conversion of the same model (older file or version)
        evict_old(self.path.parent, cache_bytes, keep=self.path)

    def abort(self) -> None:
        try:
            self.file.close()
        except OSError:
            pass
        self.tmp.unlink(missing_ok=True)


def write_entry(path: Path, tensors: dict[str, torch.Tensor], header: dict[str, str],
                info: dict, cache_bytes: int | None = None) -> bool:  # fmt: skip
    """Write the tensors (with `header` as safetensors metadata) and the JSON description
    beside them, each atomically. A full or read-only disk only costs start-up time: it is
    logged and False returned."""
    cache_bytes = budget(cache_bytes)
    room = len(json.dumps({"__metadata__": header})) + 256 * (len(tensors) + 1)
    writer = None
    try:
        writer = EntryWriter(path, room)
        for key, t in tensors.items():
            writer.write(key, t)
        writer.commit(header, info, cache_bytes)
    except OSError as e:
        if writer is not None:
            writer.abort()
        log.warning("could not cache converted weights at %s: %s", path, e)
        return False
    return True


def entries(where: Path | None = None) -> list[CacheEntry]:
    """Every complete entry, least recently used first."""
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


def evict_old(where: Path, cache_bytes: int, keep: Path | None = None) -> None:
    """Remove the least recently used entries (a load marks its entry used) while all of them
    exceed `cache_bytes`, sparing `keep`. Files of earlier versions (a .safetensors without its
    .json: dense copies, some of them float32) are removed too. A process that has an entry
    mapped keeps reading it: the file goes when the last mapping does."""
    for path in where.glob("*.safetensors"):
        if not path.with_suffix(".json").exists():
            path.unlink(missing_ok=True)
    for part in where.glob("*.part"):  # a writer killed a day ago (not one at work now)
        try:
            if time.time() - part.stat().st_mtime > 86400:
                part.unlink()
        except OSError:
            pass
    found = entries(where)
    total = sum(e.bytes for e in found)
    for entry in found:
        if total <= cache_bytes:
            break
        if entry.path != keep:
            total -= entry.bytes
            remove(entry)


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


def map_unfinished(writer: EntryWriter, metadata: dict[str, str]
                   ) -> tuple[mmap.mmap, dict, int] | None:  # fmt: skip
    """What an EntryWriter wrote before it failed, mapped as `map_entry` maps an entry (its
    header from the writer's memory; the file lacks one), or None if even that cannot be read."""
    try:
        writer.file.flush()
        mapped = _map(writer.tmp)
    except (OSError, ValueError):
        return None
    return mapped, {"__metadata__": metadata, **writer.tensors}, 8 + writer.room


def map_entry(path: Path, written_now: bool = False) -> tuple[mmap.mmap, dict, int] | None:
    """(copy-on-write mapping, safetensors header, offset of the data), or None when there is
    no entry or it is damaged (then logged, deleted: the caller rebuilds it). `written_now`:
    this process has just written it, checksum included, so it is not read again to check it
    (which would bring the whole entry into this process's resident memory while the blocks
    it was written from are still there)."""
    if written_now:
        mapped = _map(path)
        (header_len,) = struct.unpack_from("<Q", mapped, 0)
        return mapped, json.loads(mapped[8 : 8 + header_len]), 8 + header_len
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

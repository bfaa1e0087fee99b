"""Where inferd keeps what it builds once and reuses: assembled models, converted weights,
tokenizers, compiled kernels. One place, so every package asks the same folder; and one way to
trust what is found there.

Every cached file is checked before use against a checksum written beside it
(`<file>.sum`: its size and CRC-32). A file that fails the check (random bytes, truncation, a
broken header, or no checksum at all) is logged with its path, deleted and rebuilt by its
owner; it is never used. CRC-32 rather than a cryptographic hash: the threat is damage (a full
disk, a killed writer, a bad copy), and whoever can write the cache can rewrite any hash beside
it; CRC-32 runs at several GB/s, so checking the largest entry at every start costs little.

Writers publish in this order: the checksum file first, then the file itself by an atomic
rename. A reader thus never finds a new file beside a stale checksum; and a file's content is a
function of its cache key, so two processes writing the same entry write the same checksum.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import zlib
from pathlib import Path

log = logging.getLogger(__name__)

SUM_SUFFIX = ".sum"
_CHUNK = 256 << 10


def cache_dir() -> Path:
    """`$INFERD_CACHE`, else `$XDG_CACHE_HOME/inferd`, else `~/.cache/inferd`."""
    if os.environ.get("INFERD_CACHE"):
        return Path(os.environ["INFERD_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "inferd"


def checksum_of_buffer(data: bytes | bytearray | memoryview) -> str:
    """The checksum of bytes in memory (or of a mapped file), as `checksum_of` writes it."""
    # NOTE: one call over all of it: zlib releases Python's lock for the whole call, so other
    # threads run meanwhile (weight_cache.start_checking relies on it).
    with memoryview(data) as view, view.cast("B") as flat:
        return f"crc32:{len(flat)}:{zlib.crc32(flat):08x}"


def checksum_of(path: Path) -> str:
    """`crc32:<size>:<crc>` of a file's content."""
    # NOTE: one small buffer, read into again and again. A fresh bytes object per chunk (8 MiB
    # ones, before) is freed into the calling thread's malloc arena, and where that is not the
    # main thread's (the tokenizer checks its tables beside the weights' loading), glibc keeps a
    # freed block at the arena's top resident for good once platform.keep_freed_memory_in_heap
    # has raised the trim threshold: malloc_trim does not return it, so a chunk's worth stayed
    # in the engine's resident set for as long as it ran (scripts/rss_batch32.py shows it).
    crc, size = 0, 0
    buffer = bytearray(_CHUNK)
    with open(path, "rb", buffering=0) as f, memoryview(buffer) as view:
        while count := f.readinto(buffer):
            crc, size = zlib.crc32(view[:count], crc), size + count
    return f"crc32:{size}:{crc:08x}"


def sum_path(path: Path) -> Path:
    return path.with_name(path.name + SUM_SUFFIX)


def _text_beside(path: Path, text: str) -> Path:
    """A temp file holding `text` in `path`'s folder (so that a rename to `path` is atomic)."""
    with tempfile.NamedTemporaryFile(
        "w", encoding="utf-8", dir=path.parent, suffix=".part", delete=False
    ) as tmp:
        try:
            tmp.write(text)
        except BaseException:
            Path(tmp.name).unlink(missing_ok=True)
            raise
    os.chmod(tmp.name, 0o644)  # NamedTemporaryFile makes it private; it is a plain cache
    return Path(tmp.name)


def write_text_atomically(path: Path, text: str) -> None:
    """Temp file in the same folder, then a rename: readers see the old text or the new."""
    os.replace(_text_beside(path, text), path)


def publish_text(path: Path, text: str) -> None:
    """`text` as a cache entry at `path`, with its checksum (`publish`). Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _text_beside(path, text)
    try:
        publish(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def publish(tmp: Path, path: Path) -> None:
    """Move a finished temp file to `path` with its checksum (checksum first; see above).
    Raises OSError (a full or read-only disk): callers log it, a cache only costs speed."""
    write_text_atomically(sum_path(path), json.dumps({"checksum": checksum_of(tmp)}) + "\n")
    os.replace(tmp, path)


def recorded_checksum(path: Path) -> str | None:
    try:
        value = json.loads(sum_path(path).read_text()).get("checksum")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def discard(path: Path, why: str, also: tuple[Path, ...] = ()) -> None:
    """Log a damaged entry (WARNING, with its path), then delete it, its checksum and `also`."""
    log.warning("cache entry %s is damaged (%s): deleted, rebuilding it", path, why)
    for victim in (path, sum_path(path), *also):
        try:
            victim.unlink(missing_ok=True)
        except OSError as e:  # a read-only cache: the entry is skipped all the same
            log.warning("could not delete %s: %s", victim, e)


def verified(path: Path) -> bool:
    """True when `path` exists and matches its checksum. A file that does not (or has none,
    or cannot be read) is discarded (logged, deleted) and False returned: rebuild it."""
    if not path.is_file():
        return False
    expected = recorded_checksum(path)
    if expected is None:
        discard(path, "no readable checksum beside it")
        return False
    try:
        actual = checksum_of(path)
    except OSError as e:
        discard(path, f"unreadable: {e}")
        return False
    if actual != expected:
        discard(path, f"checksum {actual}, expected {expected}")
        return False
    return True

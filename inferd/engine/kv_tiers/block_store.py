"""A KV tier: a folder of block files (block_entry.py), bounded in bytes, the least recently
used evicted first. The RAM tier is such a folder in shared memory (/dev/shm), the disk tier
one on disk; every data-parallel replica of a server opens the same folders, so a block one
replica computed is found by the others, and the disk tier's files outlive the process.

    <root>/<identity>/<first two hex digits of the hash>/<block hash>.kv

A writer publishes a block by an atomic rename of a finished temp file, so readers see a whole
file or none; a killed writer leaves only a `.part` file, removed by the next scan. A read
touches the file (its mtime is the LRU clock, shared by all replicas); eviction deletes the
oldest files until the folder is under 90% of its bound. Each replica counts what it writes and
measures the folder again (a scan) when its count passes the bound or an eighth of it was
written since the last scan, so replicas together overshoot the bound by at most an eighth
of it each.

Failures cost speed, never correctness and never the server: a full disk or a read-only folder
counts a write error (logged once) and the block is not kept; a file that fails a check is
deleted and its block recomputed. The folders are the server user's alone (0700, files 0600):
a prompt can be read back from its KV.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

from inferd.engine.kv_tiers.block_entry import (
    HEADER_BYTES,
    EntryRefused,
    check_entry,
    encode_header,
)
from inferd.kv_tier_stats import TierStats

log = logging.getLogger(__name__)

SUFFIX = ".kv"
STALE_PART_S = 60.0  # a temp file this old belongs to a writer that died
EVICT_TO = 0.9  # eviction stops at this fraction of the bound


class BlockStore:
    def __init__(self, name: str, root: Path, identity: bytes, capacity: int,
                 payload_bytes: int):  # fmt: skip
        self.name, self.root, self.identity = name, Path(root), identity
        self.capacity, self.payload_bytes = capacity, payload_bytes
        self.entry_bytes = HEADER_BYTES + payload_bytes
        if self.entry_bytes > capacity:
            raise ValueError(
                f"the KV {name} tier's {capacity} bytes hold no block of this model (one block "
                f"is {self.entry_bytes} bytes): give it more"
            )
        if self.root.exists() and not self.root.is_dir():
            raise ValueError(f"the KV {name} tier's folder {self.root} is not a folder")
        self.folder = self.root / identity.hex()[:32]
        self.stats = TierStats(name, capacity_bytes=capacity)
        self._lock = threading.Lock()  # the counters: the loader and the writer threads add
        self._warned = False
        self.writable = self._prepare()
        self._stored = self._scan_and_evict() if self.writable else self._size_only()
        self._since_scan = 0

    # ---- reading (the loader thread) ----------------------------------------------------------
    def path_of(self, block_hash: bytes) -> Path:
        return block_path(self.folder, block_hash)

    def contains(self, block_hash: bytes) -> bool:
        return self.path_of(block_hash).is_file()

    def probe(self, block_hash: bytes) -> bool:
        """`contains`, counting a miss when the block is not there."""
        found = self.contains(block_hash)
        if not found:
            self._count(misses=1)
        return found

    def read(self, block_hash: bytes) -> memoryview | None:
        """The checked payload of a block, or None (not there, or refused: then deleted)."""
        path = self.path_of(block_hash)
        start = time.perf_counter()
        try:
            with open(path, "rb", buffering=0) as f:
                # NOTE: into a bytearray: the payload becomes a tensor, which wants a writable
                # buffer; and readinto makes no second copy.
                data = bytearray(os.fstat(f.fileno()).st_size)
                data = memoryview(data)[: f.readinto(data)]
        except FileNotFoundError:
            self._count(misses=1)
            return None
        except OSError as e:
            log.warning("KV %s tier: cannot read %s: %s", self.name, path, e)
            self._count(misses=1)
            return None
        try:
            payload = check_entry(data, self.identity, block_hash, self.payload_bytes)
        except EntryRefused as e:
            log.warning("KV %s tier: %s is damaged (%s): deleted, its block is recomputed",
                        self.name, path, e)  # fmt: skip
            self._remove(path)
            self._count(misses=1, damaged=1)
            return None
        try:
            os.utime(path)  # most recently used now
        except OSError:
            pass  # a read-only tier: its LRU order stays as it was
        self._count(hits=1, bytes_read=data.nbytes, load_seconds=time.perf_counter() - start)
        return payload

    # ---- writing (the writer thread) ----------------------------------------------------------
    def write(self, block_hash: bytes, payload: memoryview) -> bool:
        """Keep a block (nothing when it is there already); False when it could not be."""
        if not self.writable:
            return False
        path = self.path_of(block_hash)
        if path.exists():
            return True
        header = encode_header(self.identity, block_hash, payload)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.part")
        try:
            path.parent.mkdir(mode=0o700, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                _write_all(fd, header)
                _write_all(fd, payload)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as e:  # a full disk fails the write or the rename: nothing is left
            _unlink_quietly(tmp)
            self._write_failed(e)
            return False
        except BaseException:
            _unlink_quietly(tmp)
            raise
        size = HEADER_BYTES + payload.nbytes
        self._count(bytes_written=size)
        self._stored += size
        self._since_scan += size
        if self._stored > self.capacity or self._since_scan > self.capacity // 8:
            self._stored = self._scan_and_evict()
            self._since_scan = 0
        return True

    def _write_failed(self, error: OSError) -> None:
        self._count(write_errors=1)
        if not self._warned:  # once: a full disk stays full for a while
            self._warned = True
            log.warning("KV %s tier: could not write a block in %s (%s): blocks that do not "
                        "fit are not kept; the server goes on", self.name, self.folder,
                        error)  # fmt: skip

    # ---- the folder ---------------------------------------------------------------------------
    def _prepare(self) -> bool:
        """Make the folder (the user's alone); False when blocks cannot be written there."""
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.folder.mkdir(mode=0o700, exist_ok=True)
            os.chmod(self.folder, 0o700)
            probe = self.folder / f".probe.{os.getpid()}.part"
            probe.write_bytes(b"")
            probe.unlink()
            return True
        except OSError as e:
            log.warning("KV %s tier: %s is not writable (%s): blocks found there are read, "
                        "none are added", self.name, self.folder, e)  # fmt: skip
            return False

    def _entries(self) -> list[tuple[float, int, Path]]:
        """(mtime, bytes, path) of every block file under the root (every identity), after
        removing temp files of writers that died."""
        found, now = [], time.time()
        try:
            identities = list(os.scandir(self.root))
        except OSError:
            return found
        for ident in identities:
            if not ident.is_dir(follow_symlinks=False):
                continue
            for shard in _scandir(ident.path):
                if not shard.is_dir(follow_symlinks=False):
                    continue
                for entry in _scandir(shard.path):
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue  # evicted by another replica meanwhile
                    if entry.name.endswith(SUFFIX):
                        found.append((st.st_mtime, st.st_size, Path(entry.path)))
                    elif entry.name.endswith(".part") and now - st.st_mtime > STALE_PART_S:
                        self._remove(Path(entry.path))
        return found

    def _size_only(self) -> int:
        return sum(size for _, size, _ in self._entries())

    def _scan_and_evict(self) -> int:
        """Measure the folder; evict the least recently used down to EVICT_TO of the bound.
        Returns the bytes left."""
        entries = self._entries()
        total = sum(size for _, size, _ in entries)
        if total > self.capacity:
            entries.sort()
            goal = int(self.capacity * EVICT_TO)
            for _, size, path in entries:
                if total <= goal:
                    break
                if self._remove(path):
                    total -= size
        return total

    def _remove(self, path: Path) -> bool:
        try:
            path.unlink()
            return True
        except FileNotFoundError:
            return True  # another replica evicted it first
        except OSError as e:  # a read-only tier: the file stays, and the log says so
            log.warning("KV %s tier: could not delete %s: %s", self.name, path, e)
            return False

    def clear(self) -> int:
        """Delete every block file under the root (every identity); returns how many."""
        removed = sum(self._remove(path) for _, _, path in self._entries())
        self._stored = 0
        return removed

    def snapshot(self) -> TierStats:
        with self._lock:
            return replace(self.stats, stored_bytes=self._stored)

    def _count(self, **amounts) -> None:
        with self._lock:
            self.stats = replace(self.stats, **{k: getattr(self.stats, k) + v
                                                for k, v in amounts.items()})  # fmt: skip


def block_path(folder: Path, block_hash: bytes) -> Path:
    """Where a block's file lies in a tier's identity folder (the layout above)."""
    text = block_hash.hex()
    return folder / text[:2] / (text + SUFFIX)


def _write_all(fd: int, data) -> None:
    """Every byte, or OSError. NOTE: a write on a nearly full disk may take only part of what
    it is given and report no error: published so, the file would be cut short."""
    view = memoryview(data).cast("B")
    while view.nbytes:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, "no byte written")
        view = view[written:]


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def _scandir(path: str) -> list[os.DirEntry]:
    try:
        return list(os.scandir(path))
    except OSError:
        return []

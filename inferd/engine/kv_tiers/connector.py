"""The KV connector: the one way KV blocks leave or enter an engine (docs/architecture.md,
"Where KV lives").

    save:  a block the scheduler just named (its chained hash, inferd/block_hashes.py) is copied
           out of the pool after the step that computed it, and a writer thread puts it in every
           tier (write-through: a crash loses nothing written, and the other replicas find it
           at once)
    load:  for the first waiting prompts, a loader thread looks up their leading blocks past the
           pool's own prefix hit, tier by tier (RAM, then disk; a disk hit is copied to RAM),
           stopping at the first block no tier holds, and reads and checks each; when the
           scheduler admits the prompt, the blocks that arrived go into fresh pool blocks before
           its first step, and count as prefix-cache hits. A prompt waits for its lookup at most
           LOAD_WAIT_S (meanwhile the running sequences step on); what has not arrived by then
           is recomputed, as is every block that fails a check.

A store knows nothing of requests or tensors: blocks are bytes (`ModelRunner.read_blocks`
lays them out) under a name, in a folder keyed by what computed them (`store_identity`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from inferd.engine.kv_tiers.block_store import BlockStore
from inferd.kv_tier_stats import TierStats

log = logging.getLogger(__name__)

LOAD_WAIT_S = 2.0  # longest a prompt waits for its blocks' lookup before recomputing them
MAX_PENDING_SAVE_BYTES = 256 << 20  # blocks copied out and not yet written: more are dropped
SHM_ROOT = Path("/dev/shm")
MEMORY_FOLDER_PREFIX = "inferd-kv-"


def memory_tier_root(owner_pid: int) -> Path:
    """The RAM tier's folder of the server whose front end is `owner_pid`: in shared memory,
    so its replicas share it; removed when that server stops (`remove_memory_tier`)."""
    base = SHM_ROOT if SHM_ROOT.is_dir() else Path(tempfile.gettempdir())
    return base / f"{MEMORY_FOLDER_PREFIX}{os.getuid()}-{owner_pid}"


def remove_memory_tier(owner_pid: int) -> None:
    shutil.rmtree(memory_tier_root(owner_pid), ignore_errors=True)


def remove_orphaned_memory_tiers() -> None:
    """RAM tiers of servers of this user that died without removing theirs (a kill -9)."""
    root = memory_tier_root(0).parent
    prefix = f"{MEMORY_FOLDER_PREFIX}{os.getuid()}-"
    for path in root.glob(prefix + "*"):
        pid = path.name[len(prefix) :]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def store_identity(hash_root: bytes, weights: tuple[int, int], kv_layout: str,
                   version: str) -> bytes:  # fmt: skip
    """What a stored block's bytes depend on besides its tokens: the model and its precision
    (`hash_root`, which also roots every block hash), the weight files' size and mtime (the
    same path holding new weights computes other keys), the pool's layout (KV dtype, block
    size, heads, layers: `ModelRunner.kv_layout`) and inferd's version."""
    text = f"{hash_root.hex()}|{weights[0]}:{weights[1]}|{kv_layout}|{version}"
    return hashlib.sha256(text.encode()).digest()


@dataclass
class Lookup:
    """One prompt's blocks being looked up and read, from block `first` on."""

    hashes: list[bytes]
    first: int
    started: float = field(default_factory=time.monotonic)
    payloads: list[memoryview] = field(default_factory=list)  # blocks first, first + 1, ...
    done: bool = False
    cancelled: bool = False


@dataclass
class ConnectorCounters:
    blocks_saved: int = 0  # blocks copied out of the pool for the tiers
    saves_dropped: int = 0  # copied faster than the tiers took them: not kept
    blocks_loaded: int = 0  # blocks that entered the pool from a tier
    lookups_late: int = 0  # not finished when the prompt's wait ended: the rest recomputed


class KVConnector:
    def __init__(self, stores: list[BlockStore]):
        self.stores = stores
        self.counters = ConnectorCounters()
        self.lookups: dict[int, Lookup] = {}  # seq_id → its lookup
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="inferd-kv-load")
        self._saves: queue.Queue = queue.Queue()
        self._pending_bytes = 0
        self._pending_lock = threading.Lock()
        self._writer = threading.Thread(target=self._write_loop, name="inferd-kv-save",
                                        daemon=True)  # fmt: skip
        self._writer.start()

    # ---- loading (the scheduler's thread starts and takes; the loader thread reads) -----------
    def look_ahead(self, seq_id: int, hashes: list[bytes], first: int) -> None:
        """Start looking up `hashes[first:]` (a waiting prompt's blocks past the pool's hit)."""
        if seq_id in self.lookups or first >= len(hashes):
            return
        # NOTE: the first block is checked here (a stat per tier, microseconds): a prompt no
        # tier knows, the usual new prompt, is admitted at once instead of a step later.
        if not any(store.probe(hashes[first]) for store in self.stores):
            return
        lookup = Lookup(hashes, first)
        self.lookups[seq_id] = lookup
        self._loader.submit(self._read_chain, lookup)

    def ready(self, seq_id: int) -> bool:
        """Whether the prompt may be admitted: its lookup ended, or waited long enough."""
        lookup = self.lookups.get(seq_id)
        return lookup is None or lookup.done or time.monotonic() - lookup.started > LOAD_WAIT_S

    def take(self, seq_id: int, first: int, limit: int) -> torch.Tensor | None:
        """Blocks first, first + 1, ... (below `limit`) that arrived, as the rows of a
        [blocks, block bytes] uint8 tensor (ModelRunner.write_blocks' input); the lookup ends.
        None when none did, or the pool's hit now stops before where the lookup began."""
        lookup = self.lookups.pop(seq_id, None)
        if lookup is None:
            return None
        lookup.cancelled = True
        arrived = list(lookup.payloads)
        if not lookup.done:  # the rest is recomputed
            self.counters.lookups_late += 1
        if first < lookup.first:
            return None
        usable = arrived[first - lookup.first :][: max(0, limit - first)]
        if not usable:
            return None
        self.counters.blocks_loaded += len(usable)
        return torch.stack([torch.frombuffer(p, dtype=torch.uint8) for p in usable])

    def forget(self, seq_id: int) -> None:
        lookup = self.lookups.pop(seq_id, None)
        if lookup is not None:
            lookup.cancelled = True

    def _read_chain(self, lookup: Lookup) -> None:
        try:
            for h in lookup.hashes[lookup.first :]:
                if lookup.cancelled:
                    return
                payload = self._read_one(h)
                if payload is None:
                    return
                lookup.payloads.append(payload)
        except Exception:  # noqa: BLE001 - a lookup that fails is a miss, never a dead loader
            log.exception("KV tier lookup failed; its blocks are recomputed")
        finally:
            lookup.done = True

    def _read_one(self, block_hash: bytes) -> memoryview | None:
        for i, store in enumerate(self.stores):
            payload = store.read(block_hash)
            if payload is not None:
                for faster in self.stores[:i]:  # found lower down: keep it closer too
                    self._queue_save(block_hash, payload, [faster])
                return payload
        return None

    # ---- saving (the scheduler's thread copies; the writer thread writes) ----------------------
    def save(self, block_hashes: list[bytes], payloads) -> None:
        """Keep blocks: `payloads[i]` (a [bytes] uint8 tensor copied out of the pool, or any
        buffer) is block `block_hashes[i]`. Returns at once; the writer thread writes them."""
        for h, row in zip(block_hashes, payloads, strict=True):
            view = memoryview(row.numpy()) if hasattr(row, "numpy") else memoryview(row)
            if self._queue_save(h, view, self.stores):
                self.counters.blocks_saved += 1

    def _queue_save(self, block_hash: bytes, payload: memoryview, stores) -> bool:
        with self._pending_lock:
            if self._pending_bytes + payload.nbytes > MAX_PENDING_SAVE_BYTES:
                self.counters.saves_dropped += 1
                return False
            self._pending_bytes += payload.nbytes
        self._saves.put((block_hash, payload, stores))
        return True

    def _write_loop(self) -> None:
        while True:
            item = self._saves.get()
            if item is None:
                return
            block_hash, payload, stores = item
            try:
                for store in stores:
                    store.write(block_hash, payload)
            except Exception:  # noqa: BLE001 - a tier that fails must not end the writer
                log.exception("KV tier write failed")
            finally:
                with self._pending_lock:
                    self._pending_bytes -= payload.nbytes
                self._saves.task_done()

    def flush(self) -> None:
        """Wait until every block handed to `save` is written (tests; a clean stop)."""
        self._saves.join()

    # ---- the rest -----------------------------------------------------------------------------
    def stats(self) -> tuple[TierStats, ...]:
        return tuple(store.snapshot() for store in self.stores)

    def clear(self) -> int:
        """Delete every block of every tier; returns how many files."""
        self.flush()
        return sum(store.clear() for store in self.stores)

    def close(self) -> None:
        """Write what is queued, then stop the threads."""
        for lookup in self.lookups.values():
            lookup.cancelled = True
        self._saves.put(None)
        self._writer.join(timeout=30)
        self._loader.shutdown(wait=True, cancel_futures=True)

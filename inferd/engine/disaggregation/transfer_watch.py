"""When a prefill engine's blocks are in the transfer tier, seen from the front end.

The prefill engine's KV connector saves a prompt's blocks in the order its steps named them,
through one writer thread, and publishes each by an atomic rename (kv_tiers/block_store.py): so
once the file of the prompt's last handed block exists, the blocks before it were written too
(or dropped or failed: the decode engine then recomputes them, never serves them wrong). The
front end waits for that one file, polling with a stat, before it sends the request to its
decode engine.

NOTE: not a call to the prefill engine (a flush between its steps): that engine is usually in
the middle of the next prompt's chunk, and a call would wait for the chunk's whole step.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from inferd.engine.kv_tiers.block_store import block_path

POLL_S = 0.005
HANDOVER_WAIT_S = 5.0  # longest a request waits for its blocks' writes; then it goes on


class TransferWatch:
    def __init__(self, root: Path):
        self.root = Path(root)
        self._folders: list[Path] = []  # the tier's identity folders (one per model identity)

    def written(self, block_hash: bytes) -> bool:
        if not self._folders:
            try:
                self._folders = [p for p in self.root.iterdir() if p.is_dir()]
            except OSError:
                return False
        return any(block_path(folder, block_hash).is_file() for folder in self._folders)

    async def wait(self, block_hash: bytes, timeout: float = HANDOVER_WAIT_S) -> bool:
        """True once the block's file exists; False after `timeout` seconds without it."""
        deadline = time.monotonic() + timeout
        while not self.written(block_hash):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(POLL_S)
        return True

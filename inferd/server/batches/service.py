"""The Batch API's state in a server: the file store, the batches (in memory: a batch lives as
long as the server that runs it; its files stay on disk until they expire), the slots that bound
the lines in flight, and the sweep of expired files (at start, then every `sweep_interval_s`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any

from fastapi import Request

from inferd.cache import cache_dir
from inferd.errors import InvalidRequest
from inferd.server.batches.batch_object import COMPLETION_WINDOWS, DONE, ENDPOINTS, Batch
from inferd.server.batches.file_store import FileStore, StoredFile, expiry_seconds
from inferd.server.batches.lines import split_lines
from inferd.server.batches.runner import run_batch
from inferd.server.batches.settings import BatchSettings
from inferd.server.http.errors import APIError

log = logging.getLogger(__name__)

MAX_METADATA_PAIRS, MAX_KEY_CHARS, MAX_VALUE_CHARS = 16, 64, 512  # OpenAI's metadata bounds
_KEY_HEADERS = (b"authorization", b"x-api-key")


def owner_of(request: Request) -> str:
    """Who owns what a request uploads or creates: a digest of the API key it presented (""
    when the server has no key). The server takes one key (--api-key), so every client that
    passes the check is the same owner; the digest, not the key, is what is written to disk."""
    if not request.app.state.api_key:
        return ""
    for name in ("authorization", "x-api-key"):
        if value := request.headers.get(name):
            token = value.partition(" ")[2] if name == "authorization" else value
            return hashlib.sha256(token.strip().encode()).hexdigest()[:32]
    return ""


def not_found(what: str, given: str, param: str) -> APIError:
    return APIError(404, f"no {what} with id {given!r}", param=param, code="not_found")


class BatchService:
    def __init__(self, app: Any, settings: BatchSettings):
        self.app = app
        self.settings = settings
        self.store = FileStore(settings.files_dir or cache_dir() / "files")
        self.batches: dict[str, Batch] = {}
        self._slots: asyncio.Semaphore | None = None
        self._sweeper: asyncio.Task | None = None

    @property
    def slots(self) -> asyncio.Semaphore:
        if self._slots is None:  # created inside the running loop
            self._slots = asyncio.Semaphore(self.settings.concurrency)
        return self._slots

    # ---- the server's life --------------------------------------------------------------------
    def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def stop(self) -> None:
        tasks = [t for t in (self._sweeper, *(b.task for b in self.batches.values())) if t]
        for batch in self.batches.values():
            batch.gone.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _sweep_forever(self) -> None:
        while True:
            try:
                removed = await asyncio.to_thread(self.store.sweep)
                if removed:
                    log.info("removed %d expired batch file(s) from %s", removed, self.store.dir)
            except OSError as e:  # a sweep that fails (a full or read-only disk) is retried
                log.warning("sweeping %s failed: %s", self.store.dir, e)
            await asyncio.sleep(self.settings.sweep_interval_s)

    # ---- batches ------------------------------------------------------------------------------
    async def create(self, request: Request, body: dict[str, Any]) -> Batch:
        if unknown := sorted(set(body) - {"input_file_id", "endpoint", "completion_window",
                                          "metadata", "output_expires_after"}):  # fmt: skip
            raise InvalidRequest(unknown[0], f"unsupported parameter: {unknown[0]}")
        endpoint = body.get("endpoint")
        if endpoint not in ENDPOINTS:
            raise InvalidRequest("endpoint", f"endpoint must be one of {', '.join(ENDPOINTS)}; "
                                             f"got {endpoint!r}")  # fmt: skip
        window = body.get("completion_window")
        if window not in COMPLETION_WINDOWS:
            raise InvalidRequest(
                "completion_window", f"completion_window must be '24h', got {window!r}"
            )
        metadata = _checked_metadata(body.get("metadata"))
        expires_s = expiry_seconds(body.get("output_expires_after"), "output_expires_after")
        owner = owner_of(request)
        file_id = body.get("input_file_id")
        stored = self.store.get(file_id, owner) if isinstance(file_id, str) else None
        if stored is None:
            raise not_found("file", file_id, "input_file_id")
        if stored.meta["purpose"] != "batch":
            raise InvalidRequest("input_file_id", f"the file {file_id} has purpose "
                                 f"{stored.meta['purpose']!r}; a batch reads a file uploaded "
                                 "with purpose 'batch'")  # fmt: skip
        content = await asyncio.to_thread(stored.path.read_bytes)
        count = len(split_lines(content))
        if count == 0:
            raise InvalidRequest("input_file_id", f"the file {file_id} holds no request")
        limit = self.settings.max_batch_lines
        if count > limit:
            raise InvalidRequest("input_file_id", f"the file {file_id} holds {count} requests; a "
                                 f"batch holds at most {limit} (--max-batch-lines)")  # fmt: skip
        headers = [(k, v) for k, v in request.scope["headers"] if k.lower() in _KEY_HEADERS]
        batch = Batch(endpoint, file_id, window, metadata, owner, expires_s, headers, total=count)
        self.batches[batch.id] = batch
        batch.task = asyncio.get_running_loop().create_task(run_batch(self, batch, content))
        return batch

    def get(self, request: Request, batch_id: str) -> Batch:
        batch = self.batches.get(batch_id)
        if batch is None or batch.owner != owner_of(request):
            raise not_found("batch", batch_id, "batch_id")
        return batch

    def list(self, request: Request) -> list[Batch]:
        """The owner's batches, newest first."""
        owner = owner_of(request)
        mine = [b for b in self.batches.values() if b.owner == owner]
        return sorted(mine, key=lambda b: b.created_at, reverse=True)

    def cancel(self, request: Request, batch_id: str) -> Batch:
        batch = self.get(request, batch_id)
        if batch.status in DONE or batch.status in ("cancelling", "finalizing"):
            raise APIError(409, f"the batch {batch_id} is {batch.status}: only a batch that is "
                           "validating or in progress can be cancelled", param="batch_id",
                           code="batch_not_cancellable")  # fmt: skip
        batch.move("cancelling")
        batch.gone.set()  # the lines in flight are abandoned at once (their engine requests too)
        return batch

    # ---- files --------------------------------------------------------------------------------
    def file(self, request: Request, file_id: str) -> StoredFile:
        stored = self.store.get(file_id, owner_of(request))
        if stored is None:
            raise not_found("file", file_id, "file_id")
        return stored


def _checked_metadata(value: Any) -> dict[str, str] | None:
    """OpenAI's metadata: at most 16 string pairs, keys up to 64 characters, values up to 512."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise InvalidRequest("metadata", "metadata must be an object of string values")
    if len(value) > MAX_METADATA_PAIRS:
        raise InvalidRequest("metadata", f"metadata holds {len(value)} pairs; at most "
                                         f"{MAX_METADATA_PAIRS}")  # fmt: skip
    for k, v in value.items():
        if len(k) > MAX_KEY_CHARS or len(v) > MAX_VALUE_CHARS:
            raise InvalidRequest(
                "metadata",
                f"metadata key {k[:80]!r}: keys hold at most "
                f"{MAX_KEY_CHARS} characters, values {MAX_VALUE_CHARS}",
            )
    return dict(value)

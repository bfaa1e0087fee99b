"""The files of the Batch API, on disk: an upload's JSONL of requests, a batch's output and error
files. One folder (default `<cache_dir()>/files`, inferd/cache.py), private to the server's user
(0700, each file 0600): a file holds prompts and answers.

    <dir>/file-<24 hex>        the content
    <dir>/file-<24 hex>.json   its metadata: OpenAI's file object, plus the owner

A file is published by writing the content, then the metadata, each to a temporary name renamed
into place: a file is listed only once whole, and content without metadata (a killed writer) is
removed by the sweep. Everything is read from disk on each request rather than from an index in
memory, so two servers that share the folder agree.

Every file expires (`expires_after`, OpenAI's {"anchor": "created_at", "seconds": N}; default 30
days, as OpenAI keeps batch files): `sweep` deletes what has expired, at start and periodically
(service.py); an expired file not yet swept is already gone for the routes.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferd.errors import InvalidRequest

DEFAULT_EXPIRY_S = 30 * 24 * 3600
MIN_EXPIRY_S, MAX_EXPIRY_S = 3600, 30 * 24 * 3600  # OpenAI's bounds on expires_after.seconds
ORPHAN_AGE_S = 3600  # content without metadata this old is a dead writer's, not one at work
_ID = re.compile(r"file-[0-9a-f]{24}")


def expiry_seconds(value: Any, param: str = "expires_after") -> int:
    """The seconds of an `expires_after` object; 400 unless it is OpenAI's shape and bounds."""
    if value is None:
        return DEFAULT_EXPIRY_S
    if not isinstance(value, dict) or set(value) != {"anchor", "seconds"}:
        raise InvalidRequest(param, f'{param} must be {{"anchor": "created_at", "seconds": N}}')
    if value["anchor"] != "created_at":
        raise InvalidRequest(param, f"{param}.anchor must be 'created_at', got {value['anchor']!r}")
    seconds = value["seconds"]
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise InvalidRequest(param, f"{param}.seconds must be an integer, got {seconds!r}")
    if not MIN_EXPIRY_S <= seconds <= MAX_EXPIRY_S:
        raise InvalidRequest(param, f"{param}.seconds must be between {MIN_EXPIRY_S} (1 hour) "
                                    f"and {MAX_EXPIRY_S} (30 days), got {seconds}")  # fmt: skip
    return seconds


@dataclass
class StoredFile:
    meta: dict[str, Any]  # the file object, plus "owner"
    path: Path

    @property
    def id(self) -> str:
        return self.meta["id"]

    def public(self) -> dict[str, Any]:
        """The file object as OpenAI returns it (the owner stays private)."""
        return {k: v for k, v in self.meta.items() if k != "owner"}


class FileStore:
    def __init__(self, directory: str | Path):
        self.dir = Path(directory)

    def _ensure_dir(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)

    def _write(self, path: Path, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-")  # mkstemp: mode 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def create(self, content: bytes, filename: str, purpose: str, owner: str,
               expires_in_s: int = DEFAULT_EXPIRY_S) -> StoredFile:  # fmt: skip
        self._ensure_dir()
        file_id = f"file-{secrets.token_hex(12)}"
        now = int(time.time())
        meta = {
            "id": file_id,
            "object": "file",
            "bytes": len(content),
            "created_at": now,
            "expires_at": now + expires_in_s,
            "filename": filename,
            "purpose": purpose,
            "status": "processed",  # OpenAI's deprecated field, still in its objects
            "status_details": None,
            "owner": owner,
        }
        path = self.dir / file_id
        self._write(path, content)
        self._write(path.with_suffix(".json"), json.dumps(meta).encode())
        return StoredFile(meta, path)

    def get(self, file_id: str, owner: str, now: float | None = None) -> StoredFile | None:
        """The file, if it exists, has not expired and belongs to `owner`; else None (a 404 for
        the routes: another key's file is not told apart from a missing one)."""
        if not _ID.fullmatch(file_id):
            return None
        found = self._read(self.dir / f"{file_id}.json")
        if found is None or found.meta.get("owner") != owner or _expired(found, now):
            return None
        return found

    def _read(self, meta_path: Path) -> StoredFile | None:
        try:
            meta = json.loads(meta_path.read_bytes())
        except (OSError, ValueError):
            return None
        path = meta_path.with_suffix("")
        return StoredFile(meta, path) if path.exists() else None

    def list(self, owner: str, now: float | None = None) -> list[StoredFile]:
        """The owner's live files, newest first."""
        if not self.dir.is_dir():
            return []
        found = [self._read(p) for p in self.dir.glob("file-*.json")]
        mine = [f for f in found if f and f.meta.get("owner") == owner and not _expired(f, now)]
        return sorted(mine, key=lambda f: (f.meta["created_at"], f.id), reverse=True)

    def delete(self, stored: StoredFile) -> None:
        # The metadata first: a file without it is no longer listed, and the sweep removes
        # the content if the unlink below does not happen.
        stored.path.with_suffix(".json").unlink(missing_ok=True)
        stored.path.unlink(missing_ok=True)

    def sweep(self, now: float | None = None) -> int:
        """Deletes expired files, and content a writer left without metadata; returns how many
        files went."""
        if not self.dir.is_dir():
            return 0
        now = time.time() if now is None else now
        removed = 0
        for meta_path in self.dir.glob("file-*.json"):
            stored = self._read(meta_path)
            if stored is None or _expired(stored, now):
                meta_path.unlink(missing_ok=True)
                if stored is not None:
                    stored.path.unlink(missing_ok=True)
                removed += 1
        for path in [*self.dir.glob("file-*[!n]"), *self.dir.glob(".tmp-*")]:
            if path.suffix == ".json" or path.with_suffix(".json").exists():
                continue
            try:
                if now - path.stat().st_mtime > ORPHAN_AGE_S:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                pass
        return removed


def _expired(stored: StoredFile, now: float | None) -> bool:
    expires_at = stored.meta.get("expires_at")
    return expires_at is not None and expires_at <= (time.time() if now is None else now)

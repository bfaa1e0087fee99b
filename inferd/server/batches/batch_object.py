"""A batch: OpenAI's batch object, and the state behind it that only the server sees.

    validating → in_progress → finalizing → completed
                             ↘ cancelling → cancelled      ↘ expired (past completion_window)
    failed: the batch could not run at all (its input file vanished, the server failed)

Each status has its timestamp (`in_progress_at`, `completed_at`, ...), null until reached.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
COMPLETION_WINDOWS = {"24h": 24 * 3600}  # OpenAI's one window
DONE = frozenset({"completed", "failed", "cancelled", "expired"})
_STAMPS = ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling",
           "cancelled")  # fmt: skip


@dataclass
class Batch:
    endpoint: str
    input_file_id: str
    completion_window: str
    metadata: dict[str, str] | None
    owner: str
    output_expires_s: int  # the output and error files' expires_after.seconds
    # The caller's credentials, sent with each line (the lines pass the API key check as the
    # create request did); in memory only, never written to disk.
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    id: str = field(default_factory=lambda: f"batch_{secrets.token_hex(12)}")
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: str = "validating"
    stamps: dict[str, int] = field(default_factory=dict)
    total: int = 0
    completed: int = 0
    failed: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)  # why the whole batch failed
    # Set on cancel (and at shutdown): every line in flight sees its client go away.
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None

    @property
    def expires_at(self) -> int:
        return self.created_at + COMPLETION_WINDOWS[self.completion_window]

    def move(self, status: str) -> None:
        self.status = status
        self.stamps[status] = int(time.time())

    def public(self) -> dict[str, Any]:
        """The batch object as OpenAI returns it."""
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            **{f"{s}_at": self.stamps.get(s) for s in _STAMPS},
            "request_counts": {
                "total": self.total,
                "completed": self.completed,
                "failed": self.failed,
            },  # fmt: skip
            "metadata": self.metadata,
        }

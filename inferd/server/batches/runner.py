"""Runs a batch in the background: each line through its route (in_process.py), at most
`--batch-concurrency` lines in flight over every batch of the server (one semaphore), then the
output file (the answers with status 2xx) and the error file (the rest), in input order.

A line's engine requests run in the engine's background lane (in_process.py): its prompt is
computed only in steps that compute no interactive prompt, a few tokens a step, so that an
interactive request never waits long behind it (engine/scheduling/background_lane.py has the
rules and why). A line is moreover sent only when no request waits in the server's queue
(admission's count of requests not yet prefilled): the queue's room is left to interactive
clients, and a busy server starts no line until it has room.

A line the server is too busy for (503: its queue is full, or the line waited past
--max-queue-time) is not failed but sent again after the Retry-After the server named: a batch
has hours to finish, an interactive client does not. A line still unsent when the completion
window closes ends as `batch_expired` in the error file, and the batch as `expired`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any, Protocol

from inferd.server.batches.in_process import call_app
from inferd.server.batches.lines import Line, parse_line, split_lines

if TYPE_CHECKING:
    from inferd.server.batches.batch_object import Batch
    from inferd.server.batches.file_store import FileStore
    from inferd.server.batches.settings import BatchSettings


class BatchService(Protocol):
    """What running a batch needs of the service that owns it (service.py): a protocol here,
    so that the service imports the runner and not the reverse."""

    settings: BatchSettings
    slots: asyncio.Semaphore  # lines in flight, across all batches
    app: Any  # the server's ASGI app: each line goes through its own route
    store: FileStore


log = logging.getLogger(__name__)

RETRY_S = 1.0  # the wait before a 503'd line is sent again, when no Retry-After says otherwise
QUIET_POLL_S = 0.01  # how often a line waiting for an empty queue looks again


def _record(line: Line, response: dict[str, Any] | None,
            error: dict[str, str] | None) -> dict[str, Any]:  # fmt: skip
    return {"id": f"batch_req_{secrets.token_hex(12)}", "custom_id": line.custom_id,
            "response": response, "error": error}  # fmt: skip


async def run_batch(service: BatchService, batch: Batch, content: bytes) -> None:
    try:
        await _run(service, batch, content)
    except Exception as e:  # the batch's failure, never the server's
        log.exception("batch %s failed", batch.id)
        batch.errors.append({"code": "server_error", "message": f"the batch failed: {e}",
                             "param": None, "line": None})  # fmt: skip
        batch.move("failed")


async def _run(service: BatchService, batch: Batch, content: bytes) -> None:
    seen: set[str] = set()
    lines = [parse_line(n, raw, batch.endpoint, service.settings.priority, seen)
             for n, raw in split_lines(content)]  # fmt: skip
    results: list[dict[str, Any] | None] = [None] * len(lines)
    ok: list[bool] = [False] * len(lines)
    if batch.status == "validating":  # else cancelled before it started
        batch.move("in_progress")
    tasks = []
    for i, line in enumerate(lines):
        if batch.gone.is_set():
            break
        if line.body is None:
            results[i] = _record(line, None, {"code": "invalid_request", "message": line.error})
            batch.failed += 1
            continue
        await service.slots.acquire()
        await _queue_empty(service, batch)
        if batch.gone.is_set() or time.time() >= batch.expires_at:
            service.slots.release()
            break
        tasks.append(asyncio.create_task(_send(service, batch, i, line, results, ok)))
    await asyncio.gather(*tasks, return_exceptions=True)
    if batch.status == "cancelling":
        return await _finish(service, batch, results, ok, "cancelled")
    final = "completed"
    for i, line in enumerate(lines):
        if results[i] is None:  # never sent: the window closed first
            results[i] = _record(line, None, {"code": "batch_expired", "message":
                                              "the batch's completion window closed before "
                                              "this line ran"})  # fmt: skip
            batch.failed += 1
            final = "expired"
    await _finish(service, batch, results, ok, final)


async def _send(service: BatchService, batch: Batch, i: int, line: Line,
                results: list, ok: list) -> None:  # fmt: skip
    try:
        while True:
            status, answer = await call_app(service.app, batch.endpoint, line.body,
                                            batch.headers, batch.gone)  # fmt: skip
            if batch.gone.is_set():
                return  # cancelled: the line is in neither file
            if status == 503 and _retryable(answer) and time.time() < batch.expires_at:
                await _sleep_unless_gone(batch, RETRY_S)
                if batch.gone.is_set():
                    return
                continue
            break
        request_id = answer.get("id") if isinstance(answer, dict) else None
        body = answer if isinstance(answer, dict) else {"error": {"message": answer}}
        response = {"status_code": status, "request_id": request_id, "body": body}
        results[i] = _record(line, response, None)
        ok[i] = 200 <= status < 300
        if ok[i]:
            batch.completed += 1
        else:
            batch.failed += 1
    finally:
        service.slots.release()


async def _queue_empty(service: BatchService, batch: Batch) -> None:
    """Returns when no request waits to be prefilled (or the batch ends)."""
    admission = service.app.state.inferd.admission
    while admission.queued_requests and not batch.gone.is_set():
        if time.time() >= batch.expires_at:
            return
        await asyncio.sleep(QUIET_POLL_S)


def _retryable(answer: Any) -> bool:
    """A 503 to wait out (a full queue, a queue deadline), not the server shutting down."""
    code = answer.get("error", {}).get("code") if isinstance(answer, dict) else None
    return code != "shutting_down"


async def _sleep_unless_gone(batch: Batch, seconds: float) -> None:
    try:
        await asyncio.wait_for(batch.gone.wait(), seconds)
    except TimeoutError:
        pass


async def _finish(service: BatchService, batch: Batch, results: list, ok: list,
                  final: str) -> None:  # fmt: skip
    if final != "cancelled":
        batch.move("finalizing")
    good = [r for r, k in zip(results, ok, strict=True) if r is not None and k]
    bad = [r for r, k in zip(results, ok, strict=True) if r is not None and not k]
    for records, purpose, attr in ((good, "output", "output_file_id"),
                                   (bad, "errors", "error_file_id")):  # fmt: skip
        if records:
            stored = await asyncio.to_thread(service.store.create, _jsonl(records),
                                             f"{batch.id}_{purpose}.jsonl", "batch_output",
                                             batch.owner, batch.output_expires_s)  # fmt: skip
            setattr(batch, attr, stored.id)
    batch.move(final)


def _jsonl(records: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)

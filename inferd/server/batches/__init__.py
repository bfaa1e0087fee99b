"""OpenAI's Batch API: `/v1/files` (file_routes.py) and `/v1/batches` (batch_routes.py). A batch
runs in the background inside the server, each line through the route it names (in_process.py),
at most `--batch-concurrency` lines at once and, under `--scheduling-policy priority`, at the
lowest priority (settings.py). docs/server.md, "Batches", tells the whole story."""

from __future__ import annotations

from fastapi import FastAPI

from inferd.server.batches.batch_routes import router as batch_router
from inferd.server.batches.file_routes import router as file_router
from inferd.server.batches.service import BatchService
from inferd.server.batches.settings import BatchSettings

FILES_PATH = "/v1/files"  # the upload's path: its body limit is --max-file-bytes (limits.py)


def install_batches(app: FastAPI, settings: BatchSettings) -> BatchService:
    service = BatchService(app, settings)
    app.state.batches = service
    app.include_router(file_router)
    app.include_router(batch_router)
    return service

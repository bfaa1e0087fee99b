"""`/v1/batches` (OpenAI's Batch API): create, retrieve, list, cancel. How a batch runs is in
runner.py, what it may hold in service.py; docs/server.md ("Batches") tells the whole story."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request

from inferd.errors import InvalidRequest
from inferd.server.batches.file_routes import service_of
from inferd.server.batches.listing import checked_limit, page
from inferd.server.http.admission import ShuttingDown
from inferd.server.state import get_state

router = APIRouter()


@router.post("/v1/batches")
async def create_batch(request: Request) -> dict[str, Any]:
    if get_state(request).admission.draining:
        raise ShuttingDown()
    try:
        body = json.loads(await request.body())
    except ValueError as e:
        raise InvalidRequest(None, f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise InvalidRequest(None, "the request body must be a JSON object")
    batch = await service_of(request).create(request, body)
    return batch.public()


@router.get("/v1/batches")
async def list_batches(request: Request, after: str | None = None,
                       limit: int = 20) -> dict[str, Any]:  # fmt: skip
    checked_limit(limit, 100)
    return page(service_of(request).list(request), after, limit, lambda b: b.public())


@router.get("/v1/batches/{batch_id}")
async def retrieve_batch(batch_id: str, request: Request) -> dict[str, Any]:
    return service_of(request).get(request, batch_id).public()


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, request: Request) -> dict[str, Any]:
    return service_of(request).cancel(request, batch_id).public()

"""`/v1/files` (OpenAI's Files API, for the Batch API only): upload a JSONL of requests
(`purpose=batch`, multipart), list, retrieve, download (`/content`), delete. The output and error
files of a batch (`purpose=batch_output`) are listed and downloaded the same way. Every file is
its owner's (service.py `owner_of`): another key's file answers 404, as a missing one.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse

from inferd.errors import InvalidRequest
from inferd.server.batches.file_store import expiry_seconds
from inferd.server.batches.listing import checked_limit, page
from inferd.server.batches.multipart import parse_form
from inferd.server.batches.service import BatchService, owner_of
from inferd.server.http.admission import ShuttingDown
from inferd.server.http.errors import APIError
from inferd.server.state import get_state

router = APIRouter()

UPLOAD_PURPOSES = ("batch",)  # what this server keeps files for
_FORM_FIELDS = {"purpose", "file", "expires_after[anchor]", "expires_after[seconds]"}
_PARSE_IN_THREAD = 1 << 20


def service_of(request: Request) -> BatchService:
    return request.app.state.batches


def _expires_after(form: dict[str, Any]) -> int:
    anchor, seconds = form.get("expires_after[anchor]"), form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return expiry_seconds(None)
    try:
        seconds = int(seconds) if seconds is not None else None
    except ValueError:
        pass  # expiry_seconds names the field and the value
    return expiry_seconds({"anchor": anchor, "seconds": seconds})


@router.post("/v1/files")
async def upload_file(request: Request) -> dict[str, Any]:
    if get_state(request).admission.draining:
        raise ShuttingDown()
    service = service_of(request)
    body = await request.body()
    content_type = request.headers.get("content-type", "")
    if len(body) > _PARSE_IN_THREAD:
        parts = await asyncio.to_thread(parse_form, body, content_type)
    else:
        parts = parse_form(body, content_type)
    form: dict[str, Any] = {}
    filename = None
    for part in parts:
        if part.name not in _FORM_FIELDS:
            raise InvalidRequest(part.name, f"unsupported parameter: {part.name}")
        if part.name == "file":
            form["file"], filename = part.data, part.filename or "upload.jsonl"
        else:
            form[part.name] = part.data.decode("utf-8", "replace")
    purpose = form.get("purpose")
    if purpose not in UPLOAD_PURPOSES:
        raise InvalidRequest("purpose", f"purpose must be 'batch' (this server keeps files for "
                                        f"the Batch API only), got {purpose!r}")  # fmt: skip
    if "file" not in form:
        raise InvalidRequest("file", "the form holds no file (field 'file')")
    content = form["file"]
    limit = service.settings.max_file_bytes
    if len(content) > limit:
        raise APIError(413, f"the file holds {len(content)} bytes; the limit is {limit} "
                       "(--max-file-bytes)", param="file", code="file_too_large")  # fmt: skip
    seconds = _expires_after(form)
    stored = await asyncio.to_thread(service.store.create, content, filename, purpose,
                                     owner_of(request), seconds)  # fmt: skip
    return stored.public()


@router.get("/v1/files")
async def list_files(request: Request, purpose: str | None = None, limit: int = 10000,
                     after: str | None = None,
                     order: Literal["asc", "desc"] = "desc") -> dict[str, Any]:  # fmt: skip
    checked_limit(limit, 10000)
    service = service_of(request)
    files = await asyncio.to_thread(service.store.list, owner_of(request))
    files = [f for f in files if purpose is None or f.meta["purpose"] == purpose]
    if order == "asc":
        files.reverse()
    return page(files, after, limit, lambda f: f.public())


@router.get("/v1/files/{file_id}")
async def retrieve_file(file_id: str, request: Request) -> dict[str, Any]:
    return service_of(request).file(request, file_id).public()


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, request: Request) -> FileResponse:
    stored = service_of(request).file(request, file_id)
    return FileResponse(stored.path, media_type="application/octet-stream",
                        filename=stored.meta["filename"])  # fmt: skip


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: str, request: Request) -> dict[str, Any]:
    service = service_of(request)
    stored = service.file(request, file_id)
    service.store.delete(stored)
    return {"id": stored.id, "object": "file", "deleted": True}

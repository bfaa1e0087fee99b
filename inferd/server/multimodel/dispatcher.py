"""The ASGI app in front of the models' apps: which model a request is for, and the routes about
the server rather than one model.

A request's model is its JSON body's `model` (Ollama's /api/show also says `name`; Ollama's
`:latest` tag is dropped), else the query's `?model=`; a route that names none (GET /tokenizer_info,
/dashboard, a body without `model`) goes to the one model loaded, or to the one model served,
else gets a 400 asking for `model`. The body is read here (bounded by --max-request-bytes) and
replayed to the model's app, whose own routes then parse it as in a single-model server
(less an Ollama request's `keep_alive`, which is the pool's: keep_alive.py). Waiting for the
model's load (or for room to load it in) is bounded by --max-queue-time: a 503 with Retry-After,
as a request that waited too long in an engine's queue gets. /v1/models and /api/ps carry each
model's memory and the limits' use (`budget`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from inferd.server.http.errors import SERVER_ERROR, APIError
from inferd.server.multimodel.keep_alive import only_unloads, take_keep_alive, unloaded_reply
from inferd.server.multimodel.metrics import ModelMetrics
from inferd.server.multimodel.pool import (
    AVAILABLE,
    LOADED,
    ModelLoadError,
    ModelPool,
    ModelTooLarge,
)
from inferd.server.ollama.models import FOREVER, LATEST, OLLAMA_API_VERSION, when
from inferd.version import __version__

log = logging.getLogger(__name__)

# Routes that cannot work per model here, with why (a 501 names them rather than half-serving).
UNSERVED = {
    "/v1/files": "batch files belong to one model's server: serve that model alone for batches",
    "/v1/batches": "batches run on one model's server: serve that model alone for batches",
    "/api/pull": "a pulled model is not added to the models served: run `inferd pull NAME` and "
    "restart with --model NAME=PATH",
}
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class DispatchSettings:
    max_request_bytes: int
    max_queue_time_s: float | None = None  # bound on waiting for a model's load


def _json(body: bytes) -> Any:
    """The body's JSON value; None when it has none (the model's route answers a body that is
    not JSON with its own 400)."""
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


class Dispatcher:
    def __init__(self, pool: ModelPool, metrics: ModelMetrics, settings: DispatchSettings):
        self.pool, self.metrics, self.settings = pool, metrics, settings
        self.created = int(time.time())
        self._idle_task: asyncio.Task | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        if scope["type"] != "http":
            return
        try:
            await self._http(scope, receive, send)
        except APIError as e:
            await e.response(scope)(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        for prefix, why in UNSERVED.items():
            if path == prefix or path.startswith(prefix + "/"):
                raise APIError(501, f"{prefix} is not served with several models: {why}",
                               SERVER_ERROR, code="not_implemented")  # fmt: skip
        if method in ("GET", "HEAD"):
            own = self._own_route(path)
            if own is not None:
                return await (await own(path))(scope, receive, send)
        body = await self._read_body(scope, receive) if method in ("POST", "PUT", "PATCH") else b""
        fields = _json(body)
        name = self._model_of(scope, fields)
        keep_alive, body = take_keep_alive(path, fields, body)
        if self.pool.draining:
            raise APIError(503, "the server is shutting down", SERVER_ERROR,
                           code="shutting_down", headers={"Retry-After": "1"})  # fmt: skip
        if only_unloads(path, fields, keep_alive):  # `ollama stop`
            await self.pool.expire(name)
            return await unloaded_reply(path, fields["model"])(scope, receive, send)
        slot = await self._acquire(name, keep_alive)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the client's disconnect, when it leaves

        try:
            await slot.app(scope, replay, send)
        finally:
            self.pool.release(slot)

    async def _acquire(self, name: str, keep_alive_s: float | None):
        try:
            return await asyncio.wait_for(self.pool.acquire(name, keep_alive_s),
                                          self.settings.max_queue_time_s)  # fmt: skip
        except ModelTooLarge as e:
            raise APIError(500, str(e), SERVER_ERROR, param="model",
                           code="model_too_large") from None  # fmt: skip
        except ModelLoadError as e:
            raise APIError(500, str(e), SERVER_ERROR, param="model",
                           code="model_load_failed") from None  # fmt: skip
        except TimeoutError:
            raise APIError(503, f"the model {name!r} was not loaded within --max-queue-time "
                           f"({self.settings.max_queue_time_s:g} s)", SERVER_ERROR,
                           code="queue_timeout", headers={"Retry-After": "5"},
                           ) from None  # fmt: skip

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise APIError(499, "the client disconnected")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.settings.max_request_bytes:
                raise APIError(413, f"the request body is larger than --max-request-bytes "
                               f"({self.settings.max_request_bytes} bytes)",
                               code="request_too_large")  # fmt: skip
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _model_of(self, scope: Scope, fields: Any) -> str:
        name = None
        if isinstance(fields, dict):
            name = fields.get("model") or (fields.get("name") if scope["path"] == "/api/show"
                                           else None)  # fmt: skip
        if not name:
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            name = (query.get("model") or [None])[0]
        if name is None:
            return self._default_model()
        if not isinstance(name, str):
            raise APIError(400, "model must be a string", param="model")
        if name.endswith(LATEST) and name not in self.pool.slots:
            name = name[: -len(LATEST)]
        if name not in self.pool.slots:
            raise APIError(404, f"the model {name!r} does not exist; this server serves "
                           f"{', '.join(map(repr, self.pool.names()))}", param="model",
                           code="model_not_found")  # fmt: skip
        return name

    def _default_model(self) -> str:
        loaded = self.pool.loaded()
        if len(loaded) == 1:
            return loaded[0].name
        if len(self.pool.slots) == 1:
            return self.pool.names()[0]
        raise APIError(400, "this server serves several models: name one with `model` (in the "
                       "body, or ?model= for a route without one); models: "
                       f"{', '.join(map(repr, self.pool.names()))}", param="model")  # fmt: skip

    # ---- the server's own routes ------------------------------------------------------------
    def _own_route(self, path: str):
        if path in ("/v1/models", "/api/tags", "/api/ps"):
            return {"/v1/models": self._models, "/api/tags": self._tags,
                    "/api/ps": self._ps}[path]  # fmt: skip
        if path.startswith("/v1/models/"):
            return self._models
        if path in ("/health", "/ping"):
            return self._health
        return {"/metrics": self._metrics, "/version": self._version,
                "/api/version": self._ollama_version}.get(path)  # fmt: skip

    def _card(self, name: str) -> dict[str, Any]:
        slot = self.pool.slots[name]
        card = {"id": name, "object": "model", "created": self.created, "owned_by": "inferd",
                "root": slot.path, "state": slot.state}  # fmt: skip
        if slot.state == LOADED:
            card["max_model_len"] = slot.app.state.inferd.info.max_model_len
            card["expires_at"] = self._expires_at(slot)
        if slot.memory is not None:  # measured while loaded, else the estimate, once made
            card["memory"] = slot.memory.to_dict()
            if slot.state == LOADED:
                card["memory_bytes"] = slot.memory.total
        if slot.error is not None:
            card["last_error"] = slot.error
        return card

    def _budget(self) -> dict[str, Any]:
        """What the limits allow and what the models hold now."""
        seats = sum(s.state != AVAILABLE for s in self.pool.slots.values())
        return {"max_loaded_models": self.pool.max_loaded, "models_held": seats,
                "max_memory_bytes": self.pool.max_memory,
                "memory_used_bytes": self.pool.memory_used()}  # fmt: skip

    def _expires_at(self, slot) -> str:
        """When `slot` unloads if no request comes, as Ollama's expires_at (RFC 3339)."""
        at = self.pool.expires_at(slot)
        return FOREVER if at is None else when(time.time() + at - time.monotonic())

    async def _models(self, path: str) -> Response:
        if path == "/v1/models":
            cards = [self._card(n) for n in self.pool.names()]
            return JSONResponse({"object": "list", "data": cards, "budget": self._budget()})
        name = path[len("/v1/models/") :]
        if name not in self.pool.slots:
            raise APIError(404, f"the model {name!r} does not exist", param="model",
                           code="model_not_found")  # fmt: skip
        return JSONResponse(self._card(name))

    async def _tags(self, path: str) -> Response:
        return JSONResponse({"models": [self._ollama_entry(n, 0) for n in self.pool.names()]})

    async def _ps(self, path: str) -> Response:
        models = []
        for slot in self.pool.loaded():
            memory = slot.memory
            size = memory.total if memory else 0
            models.append(
                {
                    **self._ollama_entry(slot.name, size),
                    "size_vram": size if memory and memory.on_gpu else 0,
                    "expires_at": self._expires_at(slot),
                    "context_length": slot.app.state.inferd.info.max_model_len,
                }
            )
        return JSONResponse({"models": models, "budget": self._budget()})

    def _ollama_entry(self, name: str, size: int) -> dict[str, Any]:
        return {"name": name + LATEST, "model": name + LATEST, "size": size,
                "details": {"family": "inferd", "families": ["inferd"]}}  # fmt: skip

    async def _health(self, path: str) -> Response:
        # The server is healthy when it can take requests; a model whose engine died is
        # unloaded and loaded again by its next request (pool.py), so it does not count here.
        if self.pool.draining:
            raise APIError(503, "the server is shutting down", SERVER_ERROR,
                           code="engine_unhealthy")  # fmt: skip
        return Response(status_code=200)

    async def _metrics(self, path: str) -> Response:
        apps = [s.app for s in self.pool.loaded()]
        return Response(self.metrics.render(apps), media_type=CONTENT_TYPE)

    async def _version(self, path: str) -> Response:
        return JSONResponse({"version": __version__})

    async def _ollama_version(self, path: str) -> Response:
        return JSONResponse({"version": OLLAMA_API_VERSION})

    # ---- start and stop ---------------------------------------------------------------------
    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._idle_task = asyncio.ensure_future(self._expire())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._idle_task is not None:
                    self._idle_task.cancel()
                await self.pool.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _expire(self) -> None:
        while True:
            try:
                await self.pool.run_expiry()
            except Exception:  # the sweep must outlive one failed unload
                log.exception("unloading idle models")
                await asyncio.sleep(1.0)

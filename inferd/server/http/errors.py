"""Errors in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}`, on the
Anthropic API's paths (`/v1/messages...`) in Anthropic's: `{"type": "error", "error": {"type",
"message"}}`, the type named from the status, and on the Ollama API's (`/api/...`) in Ollama's:
`{"error": "message"}` (its clients read the field as a string).

Each typed error of `inferd/errors.py` has its status here, its `param` and `code` taken from the
exception itself (`error_status`); FastAPI's own validation errors (which would be 422 with
internal locations) become 400s naming the field. Anything else is a bug in inferd: a 500 whose
body carries an error id and no internals, logged as one line under that id, with its traceback
at most once a minute (`ErrorLog`), so that a client repeating a request that trips a bug
cannot flood the log (`InternalErrorMiddleware`).
"""

from __future__ import annotations

import logging
import math
import re
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferd.errors import (
    EngineDeadError,
    InvalidRequest,
    ModelAsleep,
    Overloaded,
    RequestFailed,
    RequestsRunning,
)

log = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"

# Union-typed fields: pydantic reports one error per alternative, so one sentence says what fits.
_EXPECTED = {
    "prompt": "a string, a list of strings, a list of token ids, or a list of token-id lists",
    "stop": "a string or a list of strings",
    "content": "a string or a list of content parts",
}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# pydantic names union members in error locations ('str', 'list[int]'); they are not fields.
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}
ANTHROPIC_PATHS = "/v1/messages"  # the Anthropic API's routes: its error shape
OLLAMA_PATHS = "/api/"  # the Ollama API's routes: its error shape
# HTTP status → Anthropic's error type (its API reference, "Errors").
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
# The error kinds a client can cause or meet, and their HTTP status.
_STATUS: tuple[tuple[type[Exception], int], ...] = (
    (InvalidRequest, 400),
    (Overloaded, 503),
    (EngineDeadError, 503),
    (ModelAsleep, 503),
    (RequestsRunning, 409),
    (RequestFailed, 500),
)


class APIError(Exception):
    """An error with its HTTP status, raised anywhere in a route and rendered by the handler."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type_
        self.param, self.code, self.headers = param, code, headers

    def body(self, path: str = "") -> dict[str, Any]:
        if path.startswith(ANTHROPIC_PATHS):
            return anthropic_error_body(self.status, self.message)
        if path.startswith(OLLAMA_PATHS):
            return {"error": self.message}
        return error_body(self.message, self.type, self.param, self.code)

    def response(self, scope: Scope | None = None) -> JSONResponse:
        """The reply, shaped for the API of the request's path (`scope`)."""
        body = self.body((scope or {}).get("path", ""))
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def error_body(
    message: str, type_: str = INVALID_REQUEST, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_status(error: BaseException, chat: bool = False) -> APIError | None:
    """The HTTP answer to one of inferd's typed errors; None for anything else (a bug). On the
    chat route the prompt is the `messages` field."""
    if isinstance(error, APIError):
        return error
    status = next((s for kind, s in _STATUS if isinstance(error, kind)), None)
    if status is None:
        return None
    code = getattr(error, "code", None)
    if isinstance(error, InvalidRequest):
        param = "messages" if chat and error.param == "prompt" else error.param
        return APIError(400, error.message or "invalid request", param=param, code=code)
    headers = None
    if isinstance(error, Overloaded):
        headers = {"Retry-After": str(error.retry_after_s)}
    return APIError(status, str(error), SERVER_ERROR, code=code, headers=headers)


class ErrorLog:
    """Unexpected errors, each one log line with an id the client also gets; the traceback is
    added to the first one and then at most once every `traceback_every_s` seconds."""

    def __init__(self, traceback_every_s: float = 60.0):
        self.traceback_every_s = traceback_every_s
        self._last_traceback = -math.inf
        self._without_traceback = 0

    def internal(self, error: BaseException, where: str) -> APIError:
        error_id = f"err-{uuid.uuid4().hex[:12]}"
        what = " ".join(f"{type(error).__name__}: {error}".split())[:500]
        now = time.monotonic()
        if now - self._last_traceback >= self.traceback_every_s:
            skipped = self._without_traceback
            note = f" ({skipped} more since the last traceback)" if skipped else ""
            log.error("internal error %s in %s: %s%s", error_id, where, what, note,
                      exc_info=error)  # fmt: skip
            self._last_traceback, self._without_traceback = now, 0
        else:
            self._without_traceback += 1
            log.error("internal error %s in %s: %s (traceback logged at most every %.0f s)",
                      error_id, where, what, self.traceback_every_s)  # fmt: skip
        return APIError(500, f"internal server error (id {error_id})", SERVER_ERROR)


def internal_error(error: BaseException, where: str, errors: ErrorLog | None = None) -> APIError:
    """Log an unexpected error (one line, a rate-limited traceback) under an id the client gets;
    `errors` is the app's log (a fresh one logs the traceback)."""
    return (errors or ErrorLog()).internal(error, where)


def app_errors(scope: Scope) -> ErrorLog | None:
    """The ErrorLog of the app serving `scope` (server/state.py), when there is one."""
    app = scope.get("app")
    state = getattr(getattr(app, "state", None), "inferd", None)
    return getattr(state, "errors", None)


def _location(loc: tuple[Any, ...]) -> list[str]:
    parts = [str(p) for p in loc[1:] if isinstance(p, int) or _IDENTIFIER.match(str(p))]
    # Cut at the first union tag: what follows describes pydantic's attempt, not the request.
    for i, part in enumerate(parts):
        if part.lower() in _TYPE_TAGS or "[" in part:
            return parts[:i]
    return parts


def from_validation_error(exc: RequestValidationError) -> APIError:
    """One readable 400 from pydantic's list of errors (the first field that failed)."""
    errors = list(exc.errors())
    if not errors:
        return APIError(400, "invalid request body")
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return APIError(400, f"the request body is not valid JSON: {detail}".rstrip(": "))
    loc = tuple(first.get("loc", ()))
    if loc == ("body",):
        return APIError(400, f"the request body must be a JSON object: {first.get('msg', '')}")
    path = _location(loc) or [str(p) for p in loc[1:2]]
    param = ".".join(path) if path else None
    same_field = [e for e in errors if tuple(e.get("loc", ()))[1:2] == loc[1:2]]
    leaf = path[-1] if path else ""
    if len(same_field) > 1 and leaf in _EXPECTED:
        message = f"{param} must be {_EXPECTED[leaf]}"
    elif first.get("type") == "missing":
        message = f"{param} is required"
    elif first.get("type") == "extra_forbidden":  # a field the route does not declare
        message = f"unsupported parameter: {param}"
    else:
        message = f"{param}: {first.get('msg', 'invalid value')}"
    return APIError(400, message, param=param)


class InternalErrorMiddleware:
    """Turns an exception no handler knows into a 500 with an error id, logged once. It sits
    just outside FastAPI's handlers, so Starlette's own last-resort handler (which would log the
    traceback a second time) never sees it."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def send_and_note(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        except Exception as exc:  # noqa: BLE001 - the last line before the client
            where = f"{scope.get('method')} {scope.get('path')}"
            error = internal_error(exc, where, app_errors(scope))
            if not started:  # else the status line is out: the connection just ends
                await error.response(scope)(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    """Map every exception a route can raise to an OpenAI-shaped reply."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response(request.scope)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return from_validation_error(exc).response(request.scope)

    async def _typed(request: Request, exc: Exception) -> JSONResponse:
        chat = request.url.path.endswith("/chat/completions")
        error = error_status(exc, chat)
        if error is None:  # not reached: registered for the typed errors only
            error = internal_error(
                exc, f"{request.method} {request.url.path}", app_errors(request.scope)
            )
        return error.response(request.scope)

    for kind, _ in _STATUS:
        app.add_exception_handler(kind, _typed)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        if message == "There was an error parsing the body":  # FastAPI's, for non-UTF-8 bytes
            message = (
                "the request body is not JSON that can be read: not UTF-8, nested too deep, "
                "or a number too long"
            )
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        type_ = INVALID_REQUEST if exc.status_code < 500 else SERVER_ERROR
        error = APIError(exc.status_code, message, type_, headers=exc.headers)
        return error.response(request.scope)

    app.add_middleware(InternalErrorMiddleware)  # first added: innermost of the middlewares

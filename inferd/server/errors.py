"""Errors in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}`.

Every failure a client can cause becomes a 4xx with a message that names the parameter; FastAPI's
own validation errors (which would be 422 with internal locations) are rewritten the same way.
Only a bug in inferd reaches the 500 handler, and its reply carries no traceback or path.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"

# Union-typed fields: pydantic reports one error per alternative, so one sentence says what fits.
_EXPECTED = {
    "prompt": "a string, a list of strings, a list of token ids, or a list of token-id lists",
    "stop": "a string or a list of strings",
    "content": "a string or a list of content parts",
}
_LEADING_NAME = re.compile(r"^(?:the )?([a-z_]+)\b")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# pydantic names union members in error locations ('str', 'list[int]'); they are not fields.
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


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

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(
    message: str, type_: str = INVALID_REQUEST, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def guess_param(message: str, fields: set[str], prompt_param: str = "prompt") -> str | None:
    """The request field a validation message is about. Engine and SamplingParams messages
    start with the parameter's name ("top_p must be ..."), or speak of the prompt."""
    if "max_model_len" in message and "max_tokens" in message:
        return "max_tokens"  # the prompt fits, the requested completion does not
    match = _LEADING_NAME.match(message)
    if match and match.group(1) in fields:
        name = match.group(1)
        return prompt_param if name == "prompt" else name
    if any(word in message for word in ("prompt", "template", "content")):
        return prompt_param
    return None


def from_value_error(error: ValueError, fields: set[str], prompt_param: str = "prompt") -> APIError:
    message = str(error) or "invalid request"
    code = "context_length_exceeded" if "max_model_len" in message else None
    return APIError(400, message, param=guess_param(message, fields, prompt_param), code=code)


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
    else:
        message = f"{param}: {first.get('msg', 'invalid value')}"
    return APIError(400, message, param=param)


def install_error_handlers(app: FastAPI, fields: set[str]) -> None:
    """Map every exception a route can raise to an OpenAI-shaped reply."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return from_validation_error(exc).response()

    @app.exception_handler(ValueError)
    async def _value_error(request: Request, exc: ValueError) -> JSONResponse:
        chat = request.url.path.endswith("/chat/completions")
        return from_value_error(exc, fields, "messages" if chat else "prompt").response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        type_ = INVALID_REQUEST if exc.status_code < 500 else SERVER_ERROR
        return APIError(exc.status_code, message, type_, headers=exc.headers).response()

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return APIError(500, "internal server error", SERVER_ERROR).response()

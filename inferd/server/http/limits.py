"""Request-body size limit (HTTP 413), enforced before any route parses the body, and a check
that the body's text is valid Unicode (400).

The middleware reads the body itself, refusing at the first byte over the limit (or at once when
Content-Length already says so), then replays it to the app. After the replay it hands `receive`
back to the server, so the routes still see the client's disconnect.

JSON lets a string hold a lone UTF-16 surrogate (`"\\ud800"`), and Python's JSON reader also
accepts CESU-8 bytes for one; either decodes to a string that no tokenizer, log or response can
encode. The body is scanned once (a regular expression, milliseconds for megabytes), so every
field of every route is covered, not only the prompt.

A large completions body is also checked against admission's per-request bounds
(server/http/admission.py) in a worker thread before the route's validation runs on the event loop:
validating `[[2, 818]] * 100000` as a request model costs the loop a tenth of a second or more,
refusing it for its 100,000 prompts costs the loop nothing.
"""

from __future__ import annotations

import asyncio
import json
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferd.errors import InvalidRequest
from inferd.server.http.errors import APIError, error_status

PRECHECK_BYTES = 64 << 10  # completions bodies above this are checked before validation
PRECHECKED_PATHS = frozenset({"/v1/completions", "/generate"})


def _too_large(limit: int, flag: str = "--max-request-bytes") -> APIError:
    return APIError(
        413,
        f"the request body exceeds the limit of {limit} bytes ({flag})",
        code="request_too_large",
    )


_RAW_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")  # UTF-8 bytes of U+D800..U+DFFF (CESU-8)
_HEX2 = rb"[0-9a-fA-F]{2}"
# A high surrogate escape not followed by a low one, or a low one not preceded by a high one.
_LONE_ESCAPE = re.compile(
    rb"\\u[dD][89abAB]" + _HEX2 + rb"(?!\\u[dD][c-fC-F]" + _HEX2 + rb")"
    rb"|(?<!\\u[dD][89abAB]" + _HEX2 + rb")\\u[dD][c-fC-F]" + _HEX2
)


_SCAN_CHUNK = 1 << 20


def lone_surrogate_at(body: bytes) -> int | None:
    """Byte offset of the first surrogate in `body` that does not form a valid pair, if any.
    NOTE: regular-expression passes over 1 MiB slices (each holds Python's lock while it runs,
    so a thread scanning a large body still lets the event loop run between slices); Python
    only looks at the rare candidates, to skip an escaped backslash before the text "ud800"."""
    for chunk_start in range(0, len(body), _SCAN_CHUNK):
        chunk_end = chunk_start + _SCAN_CHUNK
        raw = _RAW_SURROGATE.search(body, chunk_start, chunk_end + 1)
        if raw is not None and raw.start() < chunk_end:
            chunk_end = raw.start()
        # NOTE: 12 bytes past the slice let a match that starts in it see its lookahead.
        for m in _LONE_ESCAPE.finditer(body, chunk_start, chunk_end + 12):
            start, slashes = m.start(), 0
            if start >= chunk_end:
                break
            while start - slashes > 0 and body[start - slashes - 1] == 0x5C:  # backslashes
                slashes += 1
            if slashes % 2 == 0:  # else "\\\\ud800": an escaped backslash, then plain text
                return start
        if raw is not None and raw.start() < chunk_start + _SCAN_CHUNK:
            return raw.start()
    return None


def _has_surrogate(value: object) -> bool:
    if isinstance(value, str):
        return not value.isascii() and any("\ud800" <= c <= "\udfff" for c in value)
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    return False


def field_with_surrogate(body: bytes) -> str | None:
    """The top-level field of a JSON body that holds a lone surrogate (for the error's
    `param`); None when the body is no JSON object. Runs only for a body being refused."""
    try:
        document = json.loads(body)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    return next((k for k, v in document.items() if _has_surrogate(v)), None)


def precheck_prompts(body: bytes, admission) -> APIError | None:  # noqa: ANN001
    """The 400 a completions body gets from admission's per-request bounds (prompt count,
    prompt sizes), found without validating the whole body; None when it passes or is not
    shaped so (the route's validation then says what is wrong)."""
    try:
        document = json.loads(body)
        prompt, keep = document.get("prompt"), document.get("truncate_prompt_tokens")
    except (ValueError, AttributeError, RecursionError):
        return None
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int)):
        return None  # the route's validation names the field
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and
                                   all(isinstance(t, int) for t in prompt)):  # fmt: skip
        prompts = [prompt]
    elif isinstance(prompt, list) and all(isinstance(p, str | list) for p in prompt):
        prompts = prompt
    else:
        return None
    try:
        admission.check_request(prompts, keep=keep)  # truncated prompts count what they keep
    except InvalidRequest as e:
        return error_status(e)
    return None


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyLimitMiddleware:
    """`uploads`: paths whose body is a file upload, with their own limit and its flag (the Batch
    API's /v1/files: --max-file-bytes); their bodies are not scanned for surrogates, which is
    the business of each line the file holds (a batch line with one fails alone)."""

    def __init__(self, app: ASGIApp, max_bytes: int,
                 uploads: dict[str, tuple[int, str]] | None = None):  # fmt: skip
        self.app = app
        self.max_bytes = max_bytes
        self.uploads = uploads or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        upload = self.uploads.get(scope.get("path", ""))
        max_bytes, flag = upload or (self.max_bytes, "--max-request-bytes")
        declared = _content_length(scope)
        if declared is not None and declared > max_bytes:
            return await _too_large(max_bytes, flag).response(scope)(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # disconnected while sending the body
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_bytes:
                return await _too_large(max_bytes, flag).response(scope)(scope, receive, send)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        at = None
        if upload is None and (b"\\u" in body or b"\xed" in body):
            large = len(body) > _SCAN_CHUNK
            at = (
                await asyncio.to_thread(lone_surrogate_at, body)
                if large
                else lone_surrogate_at(body)
            )
        if at is not None:
            find = field_with_surrogate
            param = await asyncio.to_thread(find, body) if len(body) > _SCAN_CHUNK else find(body)
            where = f"{param} holds" if param else f"the request body holds, at byte {at},"
            error = APIError(400, f"{where} a lone UTF-16 surrogate: text must be valid Unicode "
                             "(surrogates only in pairs)", param=param)  # fmt: skip
            return await error.response(scope)(scope, receive, send)
        state = getattr(getattr(scope.get("app"), "state", None), "inferd", None)
        if len(body) > PRECHECK_BYTES and scope.get("path") in PRECHECKED_PATHS and state:
            error = await asyncio.to_thread(precheck_prompts, body, state.admission)
            if error is not None:
                return await error.response(scope)(scope, receive, send)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

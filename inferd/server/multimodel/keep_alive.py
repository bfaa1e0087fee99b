"""Ollama's `keep_alive` with several models: read by the dispatcher, mapped onto the pool.

    a duration ("5m", "1h30m") or seconds  the model unloads once idle that long after its
                                           last request ends
    0                                      unloads right after this request
    negative                               never unloads by itself (room for another model may
                                           still unload it while idle, as in Ollama)
    absent                                 --idle-unload (none: never by itself)

Every request sets its model's keep-alive (an OpenAI request, which carries none, sets the
server's), as Ollama does. A `/api/generate` without a prompt or a `/api/chat` without
messages only loads the model; with keep_alive 0 it unloads it instead (what `ollama stop`
sends) and answers at once with `done_reason: "unload"`. The field is taken out of the body
the model's app gets: that app is a single-model server's, which would refuse a 0.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

from inferd.errors import InvalidRequest
from inferd.server.http.errors import APIError
from inferd.server.ollama.keep_alive import seconds
from inferd.server.ollama.output import created_at

KEEP_ALIVE_PATHS = ("/api/generate", "/api/chat", "/api/embed", "/api/embeddings")
# route → the field without which the request only loads (or unloads) the model
_NOTHING_TO_RUN = {"/api/generate": "prompt", "/api/chat": "messages"}


def take_keep_alive(path: str, fields: Any, body: bytes) -> tuple[float | None, bytes]:
    """(the request's keep_alive in seconds, None without one; the body without it)."""
    if path not in KEEP_ALIVE_PATHS or not isinstance(fields, dict):
        return None, body
    if fields.get("keep_alive") is None:
        return None, body
    try:
        value = seconds(fields["keep_alive"])
    except InvalidRequest as e:
        raise APIError(400, e.message, param="keep_alive") from None
    rest = {k: v for k, v in fields.items() if k != "keep_alive"}
    return value, json.dumps(rest, ensure_ascii=False).encode()


def only_unloads(path: str, fields: Any, keep_alive_s: float | None) -> bool:
    """Whether the request asks only to unload its model (keep_alive 0, nothing to run)."""
    what = _NOTHING_TO_RUN.get(path)
    return what is not None and keep_alive_s == 0 and not fields.get(what)


def unloaded_reply(path: str, model: str) -> JSONResponse:
    reply = {"message": {"role": "assistant", "content": ""}} if path == "/api/chat" else {
        "response": ""}  # fmt: skip
    return JSONResponse({"model": model, "created_at": created_at(), **reply, "done": True,
                         "done_reason": "unload"})  # fmt: skip

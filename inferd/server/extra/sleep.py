"""vLLM's sleep routes: `POST /sleep?level=1|2` frees every replica's KV pool (level 2: the
weights too), `POST /wake_up` takes the memory back, `GET /is_sleeping` says which.

What it is for: a server that must stay up but sits idle (a second model on the same machine,
a GPU another job wants for a while) gives back its largest allocations without a restart.
The engine side is engine/core/sleep_mode.py.

A sleep is refused with 409 while requests run (they go on untouched: the pool they use is what
a sleep frees). While asleep, a request gets a 503 (`model_asleep`), or, with --wake-on-request,
waits for the wake and runs. Behind the API key like every route but the probes
(server/http/auth.py); a client that cannot sleep answers 501 (--ray: a Serve handle reaches one
replica, not each of them), a dead engine 503.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request

from inferd.engine_client import SleepClient
from inferd.errors import InvalidRequest
from inferd.server.http.errors import SERVER_ERROR, APIError
from inferd.server.state import get_state

log = logging.getLogger(__name__)
router = APIRouter()


def _sleeper(request: Request, allowed: tuple[str, ...] = ()) -> SleepClient:
    """The engine client, once the query holds only `allowed` parameters (vLLM's newer
    `mode` and `tags` are not implemented: a 400 naming them, not a silent ignore)."""
    unknown = sorted(set(request.query_params) - set(allowed))
    if unknown:
        raise InvalidRequest(unknown[0], f"unsupported parameter: {unknown[0]}")
    client = get_state(request).client
    if not isinstance(client, SleepClient):
        raise APIError(501, f"this server's engine client ({type(client).__name__}) cannot "
                       "sleep", SERVER_ERROR, code="not_implemented")  # fmt: skip
    return client


async def _unless_unsupported(call):
    try:
        return await call
    except NotImplementedError as e:  # the client knows why it cannot (inferd/ray_serve/client.py)
        raise APIError(501, str(e), SERVER_ERROR, code="not_implemented") from e


@router.post("/sleep")
async def sleep(request: Request, level: int = 1) -> dict[str, Any]:
    client = _sleeper(request, ("level",))
    # RequestsRunning: the handler's 409; a bad level: InvalidRequest, 400
    answer = await _unless_unsupported(client.sleep(level))
    log.warning("asleep at level %d: %d bytes freed (RSS %d → %d)", answer["level"],
                answer["freed_bytes"], answer["rss_before"], answer["rss_after"])  # fmt: skip
    return answer


@router.post("/wake_up")
async def wake_up(request: Request) -> dict[str, Any]:
    answer = await _unless_unsupported(_sleeper(request).wake_up())
    if answer["level"]:
        log.warning("awake after level %d in %.2f s", answer["level"], answer["seconds"])
    return answer


@router.get("/is_sleeping")
async def is_sleeping(request: Request) -> dict[str, bool]:
    client = _sleeper(request)
    try:
        return {"is_sleeping": client.is_sleeping()}
    except NotImplementedError as e:
        raise APIError(501, str(e), SERVER_ERROR, code="not_implemented") from e

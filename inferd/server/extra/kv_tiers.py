"""`POST /kv/clear`: delete every block the engine's KV tiers hold (`--kv-offload-memory`,
`--kv-offload-dir`), in every replica, and answer `{"object": "kv.clear", "removed_blocks": N}`.

What it is for: tiers keep blocks until they are evicted, and a disk tier even outlives the
server; this empties them without a restart (a benchmark that must start cold, prompts whose
blocks should not linger). Prompts that follow recompute what they no longer find. The engine's
own KV pool (the prefix cache on the device) is not touched.

Behind the API key like every route but the probes (server/http/auth.py). A server without
tiers answers 400, one whose engine client cannot clear them 501, a dead engine 503.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request

from inferd.engine_client import KVTierClient
from inferd.server.http.errors import SERVER_ERROR, APIError
from inferd.server.state import get_state

log = logging.getLogger(__name__)
router = APIRouter()


@router.post("/kv/clear")
async def clear_kv_tiers(request: Request) -> dict[str, Any]:
    client = get_state(request).client
    if not isinstance(client, KVTierClient):
        raise APIError(501, f"this server's engine client ({type(client).__name__}) cannot "
                       "clear KV tiers", SERVER_ERROR, code="not_implemented")  # fmt: skip
    try:
        removed = await client.clear_kv_tiers()  # InvalidRequest (no tiers): the handler's 400
    except NotImplementedError as e:  # the client knows why it cannot (inferd/ray_serve/client.py)
        raise APIError(501, str(e), SERVER_ERROR, code="not_implemented") from e
    log.info("KV tiers cleared: %d blocks removed", removed)
    return {"object": "kv.clear", "removed_blocks": removed}

"""`POST /start_profile` and `POST /stop_profile`, vLLM's routes: a torch.profiler trace of the
engine's steps between the two calls (docs/profiling.md). They exist only on a server started
with `--profiler-dir DIR` (vLLM: VLLM_TORCH_PROFILER_DIR): a trace slows every step, so an
ordinary deployment must not offer it.

The stop answers with where the files went: `{"trace": ..., "ops_table": ..., "steps": N}`.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request, Response

from inferd.engine_client import ProfilerStateError, ProfilingClient
from inferd.server.http.errors import APIError
from inferd.server.state import get_state

log = logging.getLogger(__name__)
router = APIRouter()


def _client(request: Request) -> ProfilingClient:
    client = get_state(request).client
    if not isinstance(client, ProfilingClient):  # create_app checked it; a fake may not
        raise APIError(501, "this engine cannot be profiled", code="not_implemented")
    return client


@router.post("/start_profile")
async def start_profile(request: Request) -> Response:
    directory = request.app.state.profiler_dir
    try:
        await _client(request).start_profile(directory)
    except ProfilerStateError as e:
        raise APIError(409, str(e), code="profiler_busy") from e
    log.info("profiler started (traces go to %s)", directory)
    return Response(status_code=200)


@router.post("/stop_profile")
async def stop_profile(request: Request) -> dict[str, Any]:
    try:
        files = await _client(request).stop_profile()
    except ProfilerStateError as e:
        raise APIError(409, str(e), code="profiler_idle") from e
    log.info("profiler stopped: %d steps in %s", files.steps, files.trace)
    return {"trace": files.trace, "ops_table": files.ops_table, "steps": files.steps}

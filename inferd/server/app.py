"""The FastAPI application around one engine client.

    create_app(client: EngineClient, ServerSettings(...)) → FastAPI

The server knows the engine only through `inferd.engine_client.EngineClient` (`inferd serve`
passes an `AsyncEngine`; tests may pass a fake). The client starts with the app (lifespan) and
stops with it. Middlewares, outermost first: CORS, the access log, the API key check, the
body-size limit (and the body's Unicode), the release of a request's admission, then the
internal-error guard; none uses BaseHTTPMiddleware, which would hide client disconnects from the
routes. Admission (server/http/admission.py) and the drain on shutdown (server/http/drain.py) are
configured by `ServerSettings`. `/docs` and `/openapi.json` describe every route and field.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI

from inferd.engine_client import EngineClient, ProfilingClient, SleepClient
from inferd.lora_request import LoRARequest
from inferd.server.anthropic.routes import router as messages_router
from inferd.server.batches import FILES_PATH, install_batches
from inferd.server.batches.settings import BatchSettings
from inferd.server.dashboard import install_dashboard
from inferd.server.extra.infill import router as infill_router
from inferd.server.extra.kv_tiers import router as kv_tiers_router
from inferd.server.extra.profile import router as profile_router
from inferd.server.extra.routes import router as extra_router
from inferd.server.extra.sleep import router as sleep_router
from inferd.server.http.access_log import AccessLogMiddleware
from inferd.server.http.admission import Admission, AdmissionLimits
from inferd.server.http.api_settings import APISettings
from inferd.server.http.auth import APIKeyMiddleware
from inferd.server.http.cors import CORSSettings, add_cors
from inferd.server.http.drain import Drain
from inferd.server.http.errors import install_error_handlers
from inferd.server.http.head import HeadAsGetMiddleware
from inferd.server.http.limits import BodyLimitMiddleware
from inferd.server.metrics.prometheus import ServerMetrics
from inferd.server.metrics.timeline import log_timeline
from inferd.server.ollama import install_ollama
from inferd.server.openai.chat import router as chat_router
from inferd.server.openai.completions import router as openai_router
from inferd.server.openai.embeddings import router as embeddings_router
from inferd.server.openai.shapes import TokenText
from inferd.server.openai.tool_calls import ToolSettings
from inferd.server.responses.routes import router as responses_router
from inferd.server.responses.store import ResponseStore
from inferd.server.state import ReleaseMiddleware, ServerState
from inferd.version import __version__

log = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 16 << 20


@dataclass
class ServerSettings:
    served_model_names: list[str] = field(default_factory=list)  # empty: the model's own name
    api_key: str | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    log_requests: bool = True  # one access line per request (server/http/access_log.py)
    tools: ToolSettings = field(default_factory=ToolSettings)
    cors: CORSSettings = field(default_factory=CORSSettings)
    profiler_dir: str | None = None  # set: /start_profile and /stop_profile (extra/profile.py)
    enable_request_timeline: bool = False  # honour "return_timeline" (server/metrics/timeline.py)
    dashboard: bool = True  # the chat page at /, the dashboard at /dashboard (server/dashboard/)
    # Admission control (server/http/admission.py); None: no limit.
    seats: int = 1  # the engine's max_num_seqs
    max_queued_requests: int | None = None
    max_queued_tokens: int | None = None
    max_prompts_per_request: int = 256
    max_bytes_per_token: int | None = None  # a bound from the tokenizer; None: none known
    shutdown_timeout_s: float = 20.0  # SIGTERM: how long requests in flight may still run
    api: APISettings = field(default_factory=APISettings)  # the APIs' own flags
    lora_modules: list[LoRARequest] = field(default_factory=list)  # --lora-modules
    # --allow-runtime-lora-updating: POST /v1/load_lora_adapter, /v1/unload_lora_adapter
    allow_runtime_lora_updating: bool = False
    # The models /api/pull fetches (commands/serve_catalog.py); None: /api/pull answers 501.
    catalog: Any = None
    # --wake-on-request: a request that arrives while asleep wakes the engine (extra/sleep.py)
    wake_on_request: bool = False
    batch: BatchSettings = field(default_factory=BatchSettings)  # /v1/files, /v1/batches


def _adapters(modules: list[LoRARequest], names: list[str]) -> dict[str, LoRARequest]:
    adapters = {}
    for lora in modules:
        if lora.lora_name in names or lora.lora_name in adapters:
            raise ValueError(f"--lora-modules: the name {lora.lora_name!r} is already served")
        adapters[lora.lora_name] = lora
    return adapters


def create_app(client: EngineClient, settings: ServerSettings | None = None) -> FastAPI:
    settings = settings or ServerSettings()
    info = client.model_info
    names = list(settings.served_model_names) or [info.name]
    # Per data-parallel replica when the client has several (async_core_client.py), else engine "0".
    metrics = ServerMetrics(names[0], info.max_model_len, getattr(client, "replica_stats", None))
    client.observe_outputs(metrics.observe_output)
    client.observe_outputs(log_timeline)
    limits = AdmissionLimits(
        max_model_len=info.max_model_len,
        seats=settings.seats,
        max_queued_requests=settings.max_queued_requests,
        max_queued_tokens=settings.max_queued_tokens,
        max_prompts_per_request=settings.max_prompts_per_request,
        max_bytes_per_token=settings.max_bytes_per_token,
    )
    admission = Admission(limits)
    state = ServerState(client, names, metrics, TokenText(client.tokenizer), admission,
                        tools=settings.tools, api=settings.api,
                        request_timeline=settings.enable_request_timeline,
                        adapters=_adapters(settings.lora_modules, names))  # fmt: skip
    if settings.profiler_dir and not isinstance(client, ProfilingClient):
        raise ValueError("--profiler-dir: this engine client cannot be profiled")
    if settings.wake_on_request:  # the client owns the gate: every route's requests pass it
        if not isinstance(client, SleepClient):
            raise ValueError("--wake-on-request: this engine client cannot sleep")
        client.wake_on_request = True

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client.start()
        batches.start()  # the sweep of expired batch files
        log.info("serving %s (max_model_len %d)", names[0], info.max_model_len)
        try:
            yield
        finally:
            await batches.stop()  # the batches' lines in flight end before the engine
            client.stop()

    app = FastAPI(
        title="inferd",
        version=__version__,
        lifespan=lifespan,
        docs_url="/docs",  # Swagger UI, as vLLM serves it
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.state.inferd = state
    app.state.drain = Drain(admission, settings.shutdown_timeout_s)
    install_error_handlers(app)
    app.include_router(openai_router)
    app.include_router(chat_router)
    app.include_router(embeddings_router)
    app.include_router(extra_router)
    app.include_router(infill_router)  # llama.cpp's /infill (a 400 for a model without FIM)
    app.include_router(kv_tiers_router)  # always there: a server without tiers says so (400)
    app.include_router(sleep_router)  # /sleep, /wake_up, /is_sleeping (501 where it cannot)
    app.include_router(responses_router)
    app.include_router(messages_router)
    install_ollama(app)  # the Ollama API under /api (server/ollama/)
    app.state.api_key = settings.api_key  # who owns a batch file (server/batches/service.py)
    batches = install_batches(app, settings.batch)  # /v1/files, /v1/batches
    app.state.ollama_catalog = settings.catalog
    app.state.responses = ResponseStore(settings.api.max_stored_responses)
    if settings.dashboard:  # the pages at / and /dashboard (server/dashboard/)
        install_dashboard(app, client, settings.enable_request_timeline)
    if settings.allow_runtime_lora_updating:  # as vLLM: only when asked for
        from inferd.server.extra.lora import router as lora_router

        app.include_router(lora_router)
    if settings.profiler_dir:  # as vLLM: the profiling routes exist only when asked for
        app.state.profiler_dir = settings.profiler_dir
        app.include_router(profile_router)
    app.add_middleware(HeadAsGetMiddleware)  # HEAD on every GET route
    app.add_middleware(ReleaseMiddleware)  # outside the error guard: runs last, whatever happened
    # An upload's multipart form holds its file and a few short fields: 64 KiB for those.
    upload_limit = (settings.batch.max_file_bytes + (64 << 10), "--max-file-bytes")
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes,
                       uploads={FILES_PATH: upload_limit})  # fmt: skip
    if settings.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=settings.api_key)  # outside the body limit
    if settings.log_requests:
        app.add_middleware(AccessLogMiddleware)  # outside the key check: 401s are logged too
    # Outermost: a browser's preflight is answered before the key check, and every answer
    # (401s too) carries the CORS headers a browser needs to read it.
    add_cors(app, settings.cors)
    return app

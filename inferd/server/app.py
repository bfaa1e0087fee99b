"""The FastAPI application around one engine.

    create_app(engine, ServerSettings(...)) → FastAPI

The engine loop thread starts with the app (lifespan) and stops with it. Middlewares, outermost
first: the access log, the API key check, then the body-size limit; none uses
BaseHTTPMiddleware, which would hide client disconnects from the routes.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI

from inferd import __version__
from inferd.server.access_log import AccessLogMiddleware
from inferd.server.async_engine import AsyncEngine
from inferd.server.auth import APIKeyMiddleware
from inferd.server.errors import install_error_handlers
from inferd.server.limits import BodyLimitMiddleware
from inferd.server.metrics import ServerMetrics
from inferd.server.protocol import request_fields
from inferd.server.responses import TokenText
from inferd.server.routes_extra import router as extra_router
from inferd.server.routes_openai import router as openai_router
from inferd.server.state import ServerState

log = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 16 << 20


@dataclass
class ServerSettings:
    served_model_names: list[str] = field(default_factory=list)  # empty: the checkpoint's name
    api_key: str | None = None
    max_queued_requests: int | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    stall_timeout: float = 60.0  # /health fails after this long without a step while busy
    log_requests: bool = True  # one access line per request (server/access_log.py)


def default_model_name(engine: Any) -> str:
    """A URL- and shell-friendly name: 'Gemma 3 270m' → 'gemma-3-270m'."""
    name = engine.setup.checkpoint.display_name
    return "-".join(name.lower().split()) or "inferd-model"


def fingerprint(engine: Any) -> str:
    """Changes when the weights' identity, precision or inferd's version do (the OpenAI field
    tells clients when the same request may be answered differently)."""
    setup = engine.setup
    ident = f"{__version__}|{setup.checkpoint.path}|{setup.dtype}|{engine.config.quantization}"
    return "fp_" + hashlib.sha256(ident.encode()).hexdigest()[:10]


def create_app(engine: Any, settings: ServerSettings | None = None) -> FastAPI:
    settings = settings or ServerSettings()
    names = list(settings.served_model_names) or [default_model_name(engine)]
    metrics = ServerMetrics(names[0])
    async_engine = AsyncEngine(
        engine,
        settings.max_queued_requests,
        settings.stall_timeout,
        on_output=metrics.observe_output,
    )
    state = ServerState(
        engine=async_engine,
        tokenizer=engine.tokenizer,
        model_names=names,
        max_model_len=engine.max_model_len,
        vocab_size=engine.model_config.vocab_size,
        fingerprint=fingerprint(engine),
        metrics=metrics,
        texts=TokenText(engine.tokenizer),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async_engine.start()
        log.info("serving %s (max_model_len %d)", names[0], engine.max_model_len)
        try:
            yield
        finally:
            async_engine.stop()

    app = FastAPI(
        title="inferd",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.inferd = state
    install_error_handlers(app, request_fields())
    app.include_router(openai_router)
    app.include_router(extra_router)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    if settings.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=settings.api_key)  # outside the body limit
    if settings.log_requests:
        app.add_middleware(AccessLogMiddleware)  # outside the key check: 401s are logged too
    return app

"""Cross-origin requests from browsers (CORS), with vLLM's flags: `--allowed-origins`,
`--allowed-methods`, `--allowed-headers`, `--allow-credentials`.

Unlike vLLM, no origin is allowed by default: a server on loopback would otherwise answer any web
page the user visits. A browser's preflight (`OPTIONS` with `Origin` and
`Access-Control-Request-Method`) is answered by this middleware, outside the API-key check, so it
is never a 401: allowed origins get 200 with the CORS headers, others a 400.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware


@dataclass(frozen=True)
class CORSSettings:
    allowed_origins: list[str] = field(default_factory=list)  # "*" for any
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    allow_credentials: bool = False


def parse_list(text: str) -> list[str]:
    """A flag's list: JSON (`'["http://a", "http://b"]'`, vLLM's form) or comma-separated."""
    text = text.strip()
    if text.startswith("["):
        value = json.loads(text)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"expected a JSON list of strings, got {text!r}")
        return value
    return [part.strip() for part in text.split(",") if part.strip()]


def add_cors(app: FastAPI, settings: CORSSettings) -> None:
    """Install the CORS middleware (outermost: call after every other add_middleware)."""
    if settings.allow_credentials and "*" in settings.allowed_origins:
        # Browsers refuse credentials with a wildcard origin; say so at start-up instead.
        raise ValueError("--allow-credentials needs explicit --allowed-origins, not '*'")
    app.add_middleware(
        CORSMiddleware,
        allow_origins=settings.allowed_origins,
        allow_methods=settings.allowed_methods,
        allow_headers=settings.allowed_headers,
        allow_credentials=settings.allow_credentials,
    )

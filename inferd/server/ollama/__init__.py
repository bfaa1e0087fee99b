"""The Ollama API (`/api/...`), on the same port as the OpenAI routes (docs/server.md, "The
Ollama API"): generation (routes.py), embeddings (embed.py), the model routes (models.py) and
pulls from inferd's catalog (pull.py). Errors on these paths have Ollama's shape,
`{"error": "message"}` (server/http/errors.py)."""

from __future__ import annotations

from fastapi import FastAPI


def install_ollama(app: FastAPI) -> None:
    from inferd.server.ollama.embed import router as embed_router
    from inferd.server.ollama.models import router as models_router
    from inferd.server.ollama.pull import router as pull_router
    from inferd.server.ollama.routes import router as generation_router

    for router in (generation_router, embed_router, models_router, pull_router):
        app.include_router(router)

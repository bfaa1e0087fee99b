"""Ollama's model routes: `GET /api/tags` (the models here), `POST /api/show` (one model's
details), `GET /api/ps` (the models loaded, with their memory), `GET /api/version`.

This server serves one model, loaded from start to stop: tags and ps list it under its served
names (and LoRA adapters' names), with Ollama's `:latest` tag. Ollama's clients name models
`name:tag`, so a request may name the model with or without `:latest`. What Ollama reads from
its model files and this server does not know (a parameter count, a Modelfile) is left empty
rather than made up; `model_info` holds what is known under the architecture name "inferd".
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request

from inferd.engine_client import SnapshotClient
from inferd.server.openai.protocol import Body
from inferd.server.state import ServerState, get_state

router = APIRouter()

LATEST = ":latest"
# The Ollama API version whose routes and fields this server follows (clients compare it to
# decide which fields they may send: think, format schemas, embed dimensions).
OLLAMA_API_VERSION = "0.12.0"
FOREVER = "2318-01-01T00:00:00Z"  # expires_at of a model never unloaded (Ollama's keep_alive -1)


class ShowBody(Body):
    model: str | None = None
    name: str | None = None  # the field's name in Ollama's older clients
    verbose: bool = False


def served_model(state: ServerState, name: str | None) -> str:
    """The served name `name` stands for (404 listing the served names when none)."""
    if name and name.endswith(LATEST):
        name = name[: -len(LATEST)]
    return state.check_model(name)


def _names(state: ServerState) -> list[str]:
    return [*state.model_names, *state.adapters]


def when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


async def _memory(state: ServerState) -> tuple[int, int, str]:
    """(bytes held by the weights and the KV pool, of which on the GPU, dtype); zeros when the
    engine client cannot describe itself."""
    if not isinstance(state.client, SnapshotClient):
        return 0, 0, ""
    snap = await state.client.snapshot()
    size = snap.memory.weights + snap.memory.kv_pool
    return size, size if snap.memory.device != "cpu" else 0, snap.settings.dtype


def _details(dtype: str) -> dict[str, Any]:
    return {"parent_model": "", "format": "", "family": "inferd", "families": ["inferd"],
            "parameter_size": "", "quantization_level": dtype}  # fmt: skip


def _entry(state: ServerState, name: str, size: int, dtype: str) -> dict[str, Any]:
    digest = hashlib.sha256(state.info.fingerprint.encode()).hexdigest()
    return {"name": name + LATEST, "model": name + LATEST, "modified_at": when(state.created),
            "size": size, "digest": digest, "details": _details(dtype)}  # fmt: skip


@router.get("/api/tags")
async def tags(request: Request) -> dict[str, Any]:
    state = get_state(request)
    size, _, dtype = await _memory(state)
    return {"models": [_entry(state, n, size, dtype) for n in _names(state)]}


@router.get("/api/ps")
async def ps(request: Request) -> dict[str, Any]:
    state = get_state(request)
    size, on_gpu, dtype = await _memory(state)
    loaded = {"expires_at": FOREVER, "size_vram": on_gpu,
              "context_length": state.info.max_model_len}  # fmt: skip
    return {"models": [{**_entry(state, n, size, dtype), **loaded} for n in _names(state)]}


def capabilities(state: ServerState) -> list[str]:
    """What Ollama's clients check before they send tools, think or embed requests."""
    out = ["completion"]
    if state.tools.enable_auto and state.tools.parser:  # Ollama's tools are tool_choice auto
        out.append("tools")
    if state.tools.harmony:
        out.append("thinking")
    if state.info.pooling is not None:
        out.append("embedding")
    return out


@router.post("/api/show")
async def show(body: ShowBody, request: Request) -> dict[str, Any]:
    state = get_state(request)
    served_model(state, body.model or body.name)
    _, _, dtype = await _memory(state)
    info = {"general.architecture": "inferd", "general.name": state.info.display_name,
            "inferd.context_length": state.info.max_model_len,
            "inferd.vocab_size": state.info.vocab_size}  # fmt: skip
    return {
        "modelfile": "",
        "parameters": "",
        "template": getattr(state.tokenizer, "chat_template", None) or "",
        "details": _details(dtype),
        "model_info": info,
        "capabilities": capabilities(state),
        "modified_at": when(state.created),
    }


@router.get("/api/version")
async def version() -> dict[str, str]:
    return {"version": OLLAMA_API_VERSION}

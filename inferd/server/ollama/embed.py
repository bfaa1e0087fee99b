"""Ollama's embedding routes: `POST /api/embed` (one input or several; unit-length vectors, as
Ollama returns them) and the older `POST /api/embeddings` (one `prompt`; the vector as the model
pools it, not normalised, as Ollama's older route).

`truncate`: Ollama cuts an input longer than the context by default. Here an input that does
not fit is refused with its length and the context's, unless the request says `truncate: true`
(then its first tokens are kept, Ollama's side of the cut). `dimensions` keeps the first k
values (models with Matryoshka embeddings; others refuse it). `options` are refused: nothing in
them acts on an embedding here.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request

from inferd.errors import InvalidRequest
from inferd.pooling_params import PoolingParams
from inferd.server.generation.prompts import checked_text
from inferd.server.generation.serving import abandon_when_gone, arrival_now, collect
from inferd.server.ollama.keep_alive import check_keep_alive
from inferd.server.ollama.models import served_model
from inferd.server.openai.protocol import Body
from inferd.server.openai.shapes import new_id
from inferd.server.state import ServerState, get_state

router = APIRouter()


class EmbedBody(Body):
    model: str
    input: str | list[str]
    truncate: bool | None = None
    dimensions: int | None = None
    options: dict[str, Any] | None = None
    keep_alive: str | int | float | None = None


class EmbeddingsBody(Body):
    model: str
    prompt: str
    options: dict[str, Any] | None = None
    keep_alive: str | int | float | None = None


def _refuse_options(options: dict[str, Any] | None) -> None:
    given = sorted(k for k, v in (options or {}).items() if v is not None)
    if given:
        raise InvalidRequest(
            f"options.{given[0]}",
            f"unsupported option: options.{given[0]}: embedding routes take no options here",
        )


def _token_ids(state: ServerState, texts: list[str], keep_first: bool) -> list[dict[str, Any]]:
    prompts = []
    for i, text in enumerate(texts):
        if not text:
            raise InvalidRequest("input", f"input[{i}] is an empty string")
        ids = state.tokenizer.encode(checked_text("input", text), True)
        limit = state.info.max_model_len
        if len(ids) > limit and not keep_first:
            raise InvalidRequest(
                "input",
                f"input[{i}] is {len(ids)} tokens, longer than the model's context of {limit} "
                "(this server refuses instead of truncating; truncate: true keeps the first "
                f"{limit} tokens)",
            )
        prompts.append({"prompt": None, "prompt_token_ids": ids[:limit]})
    return prompts


async def _embed(state: ServerState, request: Request, texts: list[str], params: PoolingParams,
                 keep_first: bool) -> tuple[list[list[float]], int]:  # fmt: skip
    """The texts' vectors and their token count."""
    arrival = arrival_now()
    params = params.resolve(state.info.pooling)
    group = state.admit(request, texts, 1, param="input")
    prompts = await group.tokenize(_token_ids, state, texts, keep_first)
    await group.submit(new_id("embd"), prompts, params, arrival)
    finals = await collect(group)
    outs = [finals[rid] for rid in group.request_ids]
    return [out.outputs.embedding for out in outs], sum(len(o.prompt_token_ids) for o in outs)


@router.post("/api/embed")
@abandon_when_gone
async def embed(body: EmbedBody, request: Request) -> dict[str, Any]:
    start = time.monotonic()
    state = get_state(request)
    served_model(state, body.model)
    check_keep_alive(body.keep_alive)
    _refuse_options(body.options)
    texts = [body.input] if isinstance(body.input, str) else body.input
    if not texts:
        raise InvalidRequest("input", "input must not be an empty list")
    params = PoolingParams(normalize=True, dimensions=body.dimensions)
    vectors, tokens = await _embed(state, request, texts, params, bool(body.truncate))
    return {"model": body.model, "embeddings": vectors,
            "total_duration": round((time.monotonic() - start) * 1e9), "load_duration": 0,
            "prompt_eval_count": tokens}  # fmt: skip


@router.post("/api/embeddings")
@abandon_when_gone
async def embeddings(body: EmbeddingsBody, request: Request) -> dict[str, Any]:
    state = get_state(request)
    served_model(state, body.model)
    check_keep_alive(body.keep_alive)
    _refuse_options(body.options)
    params = PoolingParams(normalize=False)
    [vector], _ = await _embed(state, request, [body.prompt], params, keep_first=False)
    return {"embedding": vector}

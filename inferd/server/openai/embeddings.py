"""`POST /v1/embeddings` (OpenAI's shape): the embedding of each input, pooled from the model's
final hidden states by the engine (inferd/pooling_params.py says how; the model's files set the
defaults, ModelInfo.pooling).

    {"model": ..., "input": "text" | ["text", ...] | [token ids] | [[token ids], ...],
     "encoding_format": "float" | "base64", "dimensions": k, "user": ...}
    → {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": ...}],
       "model": ..., "usage": {"prompt_tokens": n, "total_tokens": n}}

`base64` is the vector's float32 bytes, little-endian (what OpenAI's client decodes). vLLM's
extras: `add_special_tokens` (default true: the model's BOS, as its own embedding code adds),
`truncate_prompt_tokens` (keep the last k tokens), `normalize` (unit length; default: the
model's) and `priority` (as on completions). Each input is one engine request, batched with
whatever else runs. A generation field (`temperature`, `max_tokens`, `stream`, ...) is refused
by name: this route generates nothing.
"""

from __future__ import annotations

import base64
import struct
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ConfigDict, Field

from inferd.engine_client import TokenizerLike
from inferd.errors import InvalidRequest
from inferd.outputs import EmbeddingRequestOutput
from inferd.pooling_params import PoolingParams
from inferd.server.generation.prompts import checked_text, prioritized, truncated
from inferd.server.generation.serving import abandon_when_gone, arrival_now, collect
from inferd.server.openai.protocol import Body, OpenAIFields, TokenIds
from inferd.server.openai.shapes import new_id
from inferd.server.state import get_state, note_user

router = APIRouter()


class EmbeddingRequest(Body):
    # NOTE: extra="allow" only so that `refuse_extras` can name a generation field as such;
    # every other undeclared field is refused there, as extra="forbid" would.
    model_config = ConfigDict(strict=True, extra="allow")

    input: str | list[str] | TokenIds | list[TokenIds]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    add_special_tokens: bool = True
    truncate_prompt_tokens: int | None = Field(default=None, ge=1)
    normalize: bool | None = None
    # vLLM's, as on completions: lower first under --scheduling-policy priority (batch lines
    # run at the lowest, server/batches/settings.py); under fcfs only 0 is accepted.
    priority: int | None = None

    def inputs(self) -> list[str | TokenIds]:
        """The inputs as a list, one per embedding."""
        given = self.input
        if isinstance(given, str):
            return [given]
        if not given:
            raise InvalidRequest("input", "input must not be an empty list")
        if all(isinstance(x, int) for x in given):
            return [list(given)]  # one input given as token ids
        return list(given)

    def refuse_extras(self) -> None:
        for name in self.model_extra or {}:
            if name in OpenAIFields.model_fields or name in ("max_tokens", "logprobs"):
                raise InvalidRequest(name, f"{name} is a generation parameter: /v1/embeddings "
                                           "generates nothing, it returns each input's "
                                           "embedding")  # fmt: skip
            raise InvalidRequest(name, f"unsupported parameter: {name}")


def _token_ids(tokenizer: TokenizerLike, inputs: list[str | TokenIds], add_special_tokens: bool,
               vocab_size: int) -> list[dict[str, Any]]:  # fmt: skip
    """Each input as a prompt of token ids; errors name `input` and the entry at fault."""
    prompts = []
    for i, given in enumerate(inputs):
        if isinstance(given, str):
            if not given:
                raise InvalidRequest("input", f"input[{i}] is an empty string")
            ids = tokenizer.encode(checked_text("input", given), add_special_tokens)
            prompts.append({"prompt": given, "prompt_token_ids": ids})
        elif not given:
            raise InvalidRequest("input", f"input[{i}] is an empty list of token ids")
        elif any(not 0 <= t < vocab_size for t in given):
            bad = next(t for t in given if not 0 <= t < vocab_size)
            raise InvalidRequest("input", f"input[{i}]: token id {bad} is outside the "
                                          f"vocabulary [0, {vocab_size})")  # fmt: skip
        else:
            prompts.append({"prompt": None, "prompt_token_ids": list(given)})
    return prompts


def encode_embedding(vector: list[float], encoding_format: str) -> list[float] | str:
    """As the client asked: a list of floats, or base64 of its little-endian float32 bytes."""
    if encoding_format == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


@router.post("/v1/embeddings")
@abandon_when_gone
async def create_embeddings(body: EmbeddingRequest, request: Request) -> JSONResponse:
    arrival = arrival_now()
    state = get_state(request)
    model = state.check_model(body.model)
    note_user(request, body)
    body.refuse_extras()
    # Resolved against the model here as well as in the engine (where it changes nothing
    # more), so that a bad value costs no tokenizing.
    params = PoolingParams(normalize=body.normalize, dimensions=body.dimensions)
    params = params.resolve(state.info.pooling)
    inputs = body.inputs()
    keep = body.truncate_prompt_tokens
    group = state.admit(request, inputs, 1, param="input", keep=keep)
    prompts = await group.tokenize(_token_ids, state.tokenizer, inputs, body.add_special_tokens,
                                   state.info.vocab_size)  # fmt: skip
    prompts = prioritized(truncated(prompts, keep, state.info.max_model_len), body.priority)
    await group.submit(new_id("embd"), prompts, params, arrival)
    finals = await collect(group)
    outs: list[EmbeddingRequestOutput] = [finals[rid] for rid in group.request_ids]
    data = [
        {"object": "embedding", "index": i,
         "embedding": encode_embedding(out.outputs.embedding, body.encoding_format)}
        for i, out in enumerate(outs)
    ]  # fmt: skip
    tokens = sum(len(out.prompt_token_ids) for out in outs)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return JSONResponse({"object": "list", "data": data, "model": model, "usage": usage})

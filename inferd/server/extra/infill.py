"""llama.cpp's `POST /infill`: code completion between a prefix and a suffix, the route editor
plugins (llama.vim, llama.vscode) and some IDE clients call.

The body takes llama.cpp's fields `input_prefix`, `input_suffix`, `input_extra` (context files,
`[{"filename", "text"}]`), `prompt` (text the middle starts with), `n_predict` (its name for
max_tokens; -1: up to the context), `cache_prompt` (true only: inferd's prefix cache always
reuses what it can) and `stream`, plus the sampling and structured-output fields every
generation route takes (vLLM's names). Anything else is a 400 naming it. The prompt is built
from the model's FIM tokens (server/generation/infill_prompt.py); a model without them is a 400.

The answer has llama.cpp's /completion shape: `content`, `stop`, `stop_type` (`eos`, `word`,
`limit`), `stopping_word`, the token counts and `timings`; streamed, one `data: {"content",
"stop": false}` event per step and a last one with `stop: true` and the counts, without a
`[DONE]` line (llama.cpp's own stream has none). Admission and `--api-key` are those of every
generation route.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import Field

from inferd.errors import InvalidRequest
from inferd.outputs import RequestOutput
from inferd.sampling_params import SamplingParams
from inferd.server.generation.infill_prompt import ContextFile, infill_ids, model_fim
from inferd.server.generation.prompts import checked_text, salted
from inferd.server.generation.request_params import sampling_params
from inferd.server.generation.serving import abandon_when_gone, arrival_now, collect
from inferd.server.generation.streaming import guarded
from inferd.server.http.sse import encode_event, error_event, sse_response
from inferd.server.openai.protocol import Body, GenerationFields
from inferd.server.openai.shapes import new_id
from inferd.server.state import get_state, note_user

router = APIRouter()


class InfillFile(Body):
    filename: str = "tmp"  # llama.cpp's default for a file given without a name
    text: str = ""


class InfillRequest(GenerationFields):
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[InfillFile] = Field(default_factory=list)
    prompt: str = ""
    n_predict: int = -1  # llama.cpp's default: until the model stops or the context is full
    cache_prompt: bool = True
    stream: bool = False
    n: int = Field(default=1, ge=1, le=1)  # llama.cpp's answer holds one completion


def infill_params(body: InfillRequest) -> SamplingParams:
    if not body.cache_prompt:
        raise InvalidRequest(
            "cache_prompt",
            "cache_prompt: false is not supported (the prefix cache reuses what it can for every "
            "request; start the server with --no-enable-prefix-caching to turn it off)",
        )
    if body.truncate_prompt_tokens is not None:
        raise InvalidRequest(
            "truncate_prompt_tokens",
            "truncate_prompt_tokens is not supported on /infill: cutting the prompt's front would "
            "drop its fill-in-the-middle tokens",
        )
    if body.n_predict < -1 or body.n_predict == 0:
        raise InvalidRequest(
            "n_predict", f"n_predict must be -1 (no limit) or >= 1, got {body.n_predict}"
        )
    return sampling_params(body, None if body.n_predict == -1 else body.n_predict)


@router.post("/infill")
@abandon_when_gone
async def infill(body: InfillRequest, request: Request) -> Response:
    arrival = arrival_now()
    state = get_state(request)
    model = state.check_model(body.model)
    note_user(request, body)
    fim = model_fim(state.tokenizer, "input_prefix")
    params = infill_params(body)
    files = [ContextFile(f.filename, checked_text(f"input_extra[{i}].text", f.text))
             for i, f in enumerate(body.input_extra)]  # fmt: skip
    texts = [body.input_prefix, body.input_suffix, body.prompt, *(f.text for f in files)]
    group = state.admit(request, ["".join(texts) or " "], 1, param="input_prefix")

    def build() -> list[dict[str, Any]]:
        ids = infill_ids(state.tokenizer, fim, checked_text("input_prefix", body.input_prefix),
                         checked_text("input_suffix", body.input_suffix),
                         checked_text("prompt", body.prompt), files)  # fmt: skip
        return [{"prompt": None, "prompt_token_ids": ids}]

    prompts = salted(await group.tokenize(build), body.cache_salt)
    prompts = state.with_adapter(prompts, body.model)
    await group.submit(new_id("infill"), prompts, params, arrival)
    if body.stream:
        return sse_response(guarded(group, request, _events(group, model), _failed))
    out = (await collect(group))[group.request_ids[0]]
    return JSONResponse(_final(out, model, out.outputs[0].text))


def _failed(error: Any) -> list[bytes]:
    return [error_event(error.message, code=error.code)]


async def _events(group: Any, model: str) -> AsyncIterator[bytes]:
    async for out in group.outputs():
        sample = out.outputs[0]
        if out.finished:
            yield encode_event(_final(out, model, sample.text))
        elif sample.text:
            yield encode_event({"index": 0, "content": sample.text, "stop": False})


def _final(out: RequestOutput, model: str, content: str) -> dict[str, Any]:
    """llama.cpp's last (or only) answer: the content (a stream's last piece) and the counts."""
    sample = out.outputs[0]
    stop = sample.stop_reason
    stop_type = {"stop": "word" if isinstance(stop, str) else "eos", "length": "limit"}
    m = out.metrics
    prompt_ms = predicted_ms = None
    if m is not None and m.first_token_time is not None:
        if m.first_scheduled_time is not None:
            prompt_ms = round((m.first_token_time - m.first_scheduled_time) * 1000, 3)
        if m.last_token_time is not None:
            predicted_ms = round((m.last_token_time - m.first_token_time) * 1000, 3)
    generated = m.num_generation_tokens if m is not None else len(sample.token_ids)
    return {
        "index": 0,
        "content": content,
        "stop": True,
        "model": model,
        "stop_type": stop_type.get(sample.finish_reason or "", "none"),
        "stopping_word": stop if isinstance(stop, str) else "",
        "tokens_predicted": generated,
        "tokens_evaluated": len(out.prompt_token_ids),
        "tokens_cached": out.num_cached_tokens,
        "truncated": False,
        "timings": {
            "prompt_n": len(out.prompt_token_ids) - out.num_cached_tokens,
            "prompt_ms": prompt_ms,
            "predicted_n": generated,
            "predicted_ms": predicted_ms,
        },
    }

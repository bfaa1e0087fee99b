"""Routes beyond the OpenAI API: `/generate` (text, counts and timings of one prompt),
`/tokenize`, `/detokenize`, and the operational `/health`, `/metrics`, `/version`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from inferd.errors import InvalidRequest
from inferd.outputs import RequestMetrics
from inferd.server.admission import text_bytes
from inferd.server.errors import SERVER_ERROR, APIError
from inferd.server.metrics import CONTENT_TYPE
from inferd.server.prompts import chat_prompt, checked_text, completion_prompts, salted
from inferd.server.protocol import DetokenizeRequest, GenerateRequest, TokenizeRequest
from inferd.server.responses import new_id
from inferd.server.routes_openai import CLIENT_GONE
from inferd.server.serving import ClientDisconnected, arrival_now, collect
from inferd.server.state import get_state
from inferd.version import __version__

router = APIRouter()


def timings(m: RequestMetrics | None, num_tokens: int) -> dict[str, float | None]:
    """Seconds since arrival: the quantities a user tunes a deployment by."""

    def span(start: float | None, end: float | None) -> float | None:
        return None if start is None or end is None else round(end - start, 6)

    if m is None:
        return {}
    decode = span(m.first_token_time, m.last_token_time)
    per_token = decode / (num_tokens - 1) if decode and num_tokens > 1 else None
    return {
        "queue_s": span(m.arrival_time, m.first_scheduled_time),
        "ttft_s": span(m.arrival_time, m.first_token_time),
        "prefill_s": span(m.first_scheduled_time, m.first_token_time),
        "decode_s": decode,
        "e2e_s": span(m.arrival_time, m.finished_time),
        "tpot_s": round(per_token, 6) if per_token else None,
        "tokens_per_s": round(1 / per_token, 3) if per_token else None,
        "cached_prompt_tokens": m.num_cached_tokens,
    }


@router.post("/generate")
async def generate(body: GenerateRequest, request: Request) -> Any:
    arrival = arrival_now()
    state = get_state(request)
    state.check_model(body.model)
    params = body.sampling_params()
    group = state.admit(request, [body.prompt], params.n)  # 400/503 before tokenizing
    prompts = await group.tokenize(completion_prompts, state.tokenizer, [body.prompt])
    prompts = salted(prompts, body.cache_salt)
    await group.submit(new_id("gen"), prompts, params, arrival)
    try:
        out = (await collect(group, request))[group.request_ids[0]]
    except ClientDisconnected:
        return Response(status_code=CLIENT_GONE)
    sample = out.outputs[0]
    return {
        "text": sample.text,
        "token_ids": list(sample.token_ids),
        "prompt_tokens": len(out.prompt_token_ids),
        "completion_tokens": len(sample.token_ids),
        "finish_reason": sample.finish_reason,
        "stop_reason": sample.stop_reason,
        "timings": timings(out.metrics, len(sample.token_ids)),
    }


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    state = get_state(request)
    state.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise InvalidRequest("prompt", "prompt: give exactly one of 'prompt' or 'messages'")
    tok = state.tokenizer
    if body.messages is not None:
        messages = [m.to_template() for m in body.messages]
        rendered = await state.tokenize(chat_prompt, tok, messages, body.add_generation_prompt)
        ids = rendered["prompt_token_ids"]
        if body.add_special_tokens:  # the template wrote its own; add them only on request
            ids = await state.tokenize(tok.encode, rendered["prompt"], True)
    else:
        text = checked_text("prompt", body.prompt)
        nbytes = text_bytes(text)
        ids = await state.tokenize(tok.encode, text, body.add_special_tokens is not False,
                                   nbytes=nbytes)  # fmt: skip
    return {"tokens": ids, "count": len(ids), "max_model_len": state.info.max_model_len}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
    state = get_state(request)
    state.check_model(body.model)
    bad = next((t for t in body.tokens if not 0 <= t < state.info.vocab_size), None)
    if bad is not None:
        raise InvalidRequest(
            "tokens",
            f"tokens: token id {bad} is outside the vocabulary [0, {state.info.vocab_size})",
        )
    return {"prompt": await state.tokenize(state.tokenizer.decode, body.tokens)}


@router.get("/health")
async def health(request: Request) -> Response:
    state = get_state(request)
    problem = state.client.health()
    if problem is None and state.admission.draining:
        problem = "the server is shutting down"
    if problem is not None:
        raise APIError(503, problem, SERVER_ERROR, code="engine_unhealthy")
    return Response(status_code=200)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = get_state(request)
    return Response(state.metrics.render(state.client.stats()), media_type=CONTENT_TYPE)


@router.get("/version")
async def version() -> dict[str, str]:
    return {"version": __version__}

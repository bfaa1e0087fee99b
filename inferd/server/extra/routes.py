"""Routes beyond the OpenAI API: `/generate` (text, counts and timings of one prompt),
`/tokenize`, `/detokenize`, `/tokenizer_info`, and the operational `/health` (also as `/ping`),
`/metrics`, `/version`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from inferd.errors import InvalidRequest
from inferd.outputs import RequestMetrics
from inferd.server.generation.prompts import (
    chat_render,
    checked_text,
    completion_prompts,
    prioritized,
    salted,
    truncated,
)
from inferd.server.generation.request_params import generate_params
from inferd.server.generation.serving import abandon_when_gone, arrival_now, collect
from inferd.server.http.admission import all_text, text_bytes
from inferd.server.http.errors import SERVER_ERROR, APIError
from inferd.server.metrics.prometheus import CONTENT_TYPE
from inferd.server.metrics.timeline import timeline_json
from inferd.server.openai.protocol import (
    ChatTemplateFields,
    DetokenizeRequest,
    GenerateRequest,
    TokenizeRequest,
)
from inferd.server.openai.shapes import new_id
from inferd.server.state import get_state, note_user
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
@abandon_when_gone
async def generate(body: GenerateRequest, request: Request) -> Any:
    arrival = arrival_now()
    state = get_state(request)
    state.check_model(body.model)
    note_user(request, body)
    params = generate_params(body)
    timeline = state.check_timeline(body.return_timeline)
    keep = params.truncate_prompt_tokens
    group = state.admit(request, [body.prompt], params.n, keep=keep)  # 400/503 before tokenizing
    prompts = await group.tokenize(completion_prompts, state.tokenizer, [body.prompt])
    prompts = salted(truncated(prompts, keep, state.info.max_model_len), body.cache_salt)
    prompts = prioritized(prompts, body.priority)
    prompts = state.with_adapter(prompts, body.model)
    await group.submit(new_id("gen"), prompts, params, arrival)
    out = (await collect(group))[group.request_ids[0]]
    sample = out.outputs[0]
    extra = {"timeline": timeline_json(out)} if timeline else {}
    return {
        "text": sample.text,
        "token_ids": list(sample.token_ids),
        "prompt_tokens": len(out.prompt_token_ids),
        "completion_tokens": len(sample.token_ids),
        "finish_reason": sample.finish_reason,
        "stop_reason": sample.stop_reason,
        "timings": timings(out.metrics, len(sample.token_ids)),
        **extra,
    }


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    state = get_state(request)
    state.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise InvalidRequest("prompt", "prompt: give exactly one of 'prompt' or 'messages'")
    tok = state.tokenizer
    if body.messages is not None:
        chat = ChatTemplateFields(
            messages=body.messages,
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
            chat_template_kwargs=body.chat_template_kwargs,
            split_special_tokens=body.split_special_tokens,
            tools=body.tools,
        )
        messages = chat.template_messages()
        rendered = await state.tokenize(
            chat_render(tok, chat, messages, chat.tools, state.tools.template,
                        body.add_special_tokens),
            nbytes=text_bytes(all_text(messages)),
        )  # fmt: skip
        ids = rendered["prompt_token_ids"]
    else:
        chat_only = ("add_generation_prompt", "continue_final_message", "chat_template_kwargs",
                     "split_special_tokens", "tools")  # fmt: skip
        for name in chat_only:
            if name in body.model_fields_set:
                raise InvalidRequest(name, f"{name} applies to 'messages', not to 'prompt'")
        text = checked_text("prompt", body.prompt)
        ids = await state.tokenize(tok.encode, text, body.add_special_tokens is not False,
                                   nbytes=text_bytes(text))  # fmt: skip
    out: dict[str, Any] = {"tokens": ids, "count": len(ids),
                           "max_model_len": state.info.max_model_len}  # fmt: skip
    # vLLM's field, null unless asked for (clients read it)
    out["token_strs"] = tok.convert_ids_to_tokens(ids) if body.return_token_strs else None
    return out


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


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request) -> dict[str, Any]:
    """vLLM's route: the tokenizer's tokenizer_config.json (class, special tokens, added tokens,
    chat template, model_max_length), what `inferd export-tokenizer` writes; clients such as
    lm-eval read it instead of fetching the model's files from a hub."""
    state = get_state(request)
    describe = getattr(state.tokenizer, "hf_tokenizer_config", None)
    if describe is None:  # an engine client whose tokenizer is not inferd's
        raise APIError(501, "this server's tokenizer cannot describe itself",
                       SERVER_ERROR, code="not_implemented")  # fmt: skip
    return await state.tokenize(describe, state.info.max_model_len)


@router.get("/health")
async def health(request: Request) -> Response:
    state = get_state(request)
    problem = state.client.health()
    if problem is None and state.admission.draining:
        problem = "the server is shutting down"
    if problem is not None:
        raise APIError(503, problem, SERVER_ERROR, code="engine_unhealthy")
    return Response(status_code=200)


@router.get("/ping")
@router.post("/ping", operation_id="ping_post")
async def ping(request: Request) -> Response:
    """The health check under the name load balancers (SageMaker) and vLLM use."""
    return await health(request)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = get_state(request)
    return Response(state.metrics.render(state.client.stats()), media_type=CONTENT_TYPE)


@router.get("/version")
async def version() -> dict[str, str]:
    return {"version": __version__}

"""The OpenAI API: `/v1/completions`, `/v1/chat/completions` (plain and streamed), `/v1/models`.

Each route: check the model name, build SamplingParams (400 on a bad value), tokenize in a worker
thread, submit (the engine's own validation answers 400 here, before any byte is streamed), then
either wait for the final outputs or stream deltas.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from inferd.outputs import RequestOutput
from inferd.server.admission import all_text
from inferd.server.choices import (
    DeltaTracker,
    Echo,
    chat_choice,
    completion_choice,
    full_sample,
)
from inferd.server.prompts import chat_prompt, completion_prompts, prompt_text, salted
from inferd.server.protocol import ChatCompletionRequest, CompletionRequest
from inferd.server.responses import chat_logprobs, completion_logprobs, new_id, usage_of
from inferd.server.serving import ClientDisconnected, arrival_now, collect
from inferd.server.sse import sse_response
from inferd.server.state import ServerState, get_state
from inferd.server.streaming import stream_events

router = APIRouter()
CLIENT_GONE = 499  # nginx's code for "client closed request": nobody reads it, logs do


def _head(state: ServerState, request_id: str, obj: str, model: str) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": state.info.fingerprint,
    }


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    state = get_state(request)
    data = [
        {
            "id": name,
            "object": "model",
            "created": state.created,
            "owned_by": "inferd",
            "root": state.model_name,
            "max_model_len": state.info.max_model_len,
        }
        for name in state.model_names
    ]
    return {"object": "list", "data": data}


@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    arrival = arrival_now()
    state = get_state(request)
    model = state.check_model(body.model)
    params = body.sampling_params()
    group = state.admit(request, body.prompts(), params.n)  # 400/503 before tokenizing
    prompts = await group.tokenize(completion_prompts, state.tokenizer, body.prompts())
    prompts = salted(prompts, body.cache_salt)
    echo_texts: list[str] = []
    if body.echo:
        echo_texts = await state.tokenize(
            lambda: [prompt_text(state.tokenizer, p, state.info.vocab_size) for p in prompts]
        )
    request_id = new_id("cmpl")
    await group.submit(request_id, prompts, params, arrival)
    head = _head(state, request_id, "text_completion", model)
    want_logprobs = params.logprobs is not None

    def echo_of(p: int, out: RequestOutput) -> Echo | None:
        return Echo.of(out, echo_texts[p], want_logprobs) if body.echo else None

    if body.stream:
        tracker, offsets = DeltaTracker(), {}

        def chunk(p: int, out: RequestOutput) -> list[dict[str, Any]]:
            choices = []
            for c in out.outputs:
                if not c.token_ids and c.finish_reason is None:
                    continue  # still in prefill: nothing to send yet
                text, ids, entries = full_sample(c, echo_of(p, out))
                index = p * params.n + c.index
                d = tracker.take(index, text, len(ids), c.finish_reason, want_logprobs)
                if d is None:
                    continue
                lp = None
                if want_logprobs:
                    lp, offsets[index] = completion_logprobs(
                        ids[d.token_start : d.token_end],
                        entries[d.token_start : d.token_end],
                        state.texts,
                        offsets.get(index, 0),
                    )
                choices.append(
                    {
                        "index": index,
                        "text": d.text,
                        "logprobs": lp,
                        "finish_reason": d.finish_reason,
                        "stop_reason": c.stop_reason if d.finish_reason else None,
                    }
                )
            return choices

        usage = bool(body.stream_options and body.stream_options.include_usage)
        return sse_response(stream_events(group, request, head, chunk, usage))

    try:
        finals = await collect(group, request)
    except ClientDisconnected:
        return Response(status_code=CLIENT_GONE)
    outs = [finals[rid] for rid in group.request_ids]
    choices = [
        completion_choice(p * params.n + c.index, c, echo_of(p, out), want_logprobs, state.texts)
        for p, out in enumerate(outs)
        for c in out.outputs
    ]
    choices.sort(key=lambda c: c["index"])
    return JSONResponse({**head, "choices": choices, "usage": usage_of(outs)})


@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    arrival = arrival_now()
    state = get_state(request)
    model = state.check_model(body.model)
    params = body.sampling_params()
    messages = body.template_messages()
    group = state.admit(request, [all_text(messages)], params.n, "messages")
    prompt = await group.tokenize(
        chat_prompt,
        state.tokenizer,
        messages,
        body.add_generation_prompt,
        body.chat_template_kwargs,
    )
    request_id = new_id("chatcmpl")
    await group.submit(request_id, salted([prompt], body.cache_salt), params, arrival)
    top = (body.top_logprobs or 0) if body.logprobs else None

    if body.stream:
        head = _head(state, request_id, "chat.completion.chunk", model)
        tracker = DeltaTracker()

        def chunk(p: int, out: RequestOutput) -> list[dict[str, Any]]:
            choices = []
            for c in out.outputs:
                d = tracker.take(
                    c.index, c.text, len(c.token_ids), c.finish_reason, top is not None
                )
                if d is None:
                    continue
                lp = None
                if top is not None:
                    ids, entries = list(c.token_ids), list(c.logprobs or [])
                    window = slice(d.token_start, d.token_end)
                    lp = {"content": chat_logprobs(ids[window], entries[window], state.texts, top)}
                delta = {"content": d.text} if d.text or d.finish_reason is None else {}
                choices.append(
                    {
                        "index": c.index,
                        "delta": delta,
                        "logprobs": lp,
                        "finish_reason": d.finish_reason,
                        "stop_reason": c.stop_reason if d.finish_reason else None,
                    }
                )
            return choices

        opening = [
            {
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            for i in range(params.n)
        ]
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return sse_response(stream_events(group, request, head, chunk, usage, opening))

    try:
        finals = await collect(group, request)
    except ClientDisconnected:
        return Response(status_code=CLIENT_GONE)
    out = finals[group.request_ids[0]]
    choices = [chat_choice(c.index, c, top, state.texts) for c in out.outputs]
    choices.sort(key=lambda c: c["index"])
    head = _head(state, request_id, "chat.completion", model)
    return JSONResponse({**head, "choices": choices, "usage": usage_of([out])})

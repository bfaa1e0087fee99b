"""The OpenAI API: `/v1/completions` (plain and streamed) and `/v1/models`; the chat route is in
routes_chat.py.

Each generation route: check the model name, build SamplingParams (400 on a bad value or an
unsupported field), tokenize in a worker thread, submit (the engine's own validation, grammar
compilation included, answers 400 here, before any byte is streamed), then either wait for the
final outputs or stream deltas.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from inferd.errors import InvalidRequest
from inferd.outputs import CompletionOutput, RequestOutput
from inferd.server.generation.infill_prompt import model_fim, suffix_prompts
from inferd.server.generation.prompts import (
    completion_prompts,
    prioritized,
    prompt_text,
    salted,
    truncated,
)
from inferd.server.generation.request_params import (
    completion_params,
    refuse_streamed_prompt_logprobs,
)
from inferd.server.generation.serving import abandon_when_gone, arrival_now, collect
from inferd.server.generation.streaming import stream_events
from inferd.server.http.errors import APIError
from inferd.server.http.sse import sse_response
from inferd.server.metrics.timeline import timeline_json
from inferd.server.openai.choices import ChoiceDeltas, Echo, completion_choice
from inferd.server.openai.protocol import CompletionRequest, StreamOptions
from inferd.server.openai.shapes import (
    TokenText,
    completion_logprobs,
    new_id,
    prompt_logprobs_json,
    usage_of,
)
from inferd.server.state import ServerState, get_state, note_user

router = APIRouter()


def head_of(state: ServerState, response_id: str, obj: str, model: str) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": state.info.fingerprint,
    }


def response_id(prefix: str, given: str | None) -> str:
    """The response's id: `request_id` when the client chose one (vLLM), else a fresh one.
    NOTE: engine requests get their own fresh ids, so two clients may send the same one."""
    return f"{prefix}-{given}" if given else new_id(prefix)


def _model_card(state: ServerState, name: str) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": state.created,
        "owned_by": "inferd",
        "root": state.model_name,
        "max_model_len": state.info.max_model_len,
    }


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    state = get_state(request)
    cards = [_model_card(state, n) for n in state.model_names]
    cards += [_adapter_card(state, lora) for lora in state.adapters.values()]
    return {"object": "list", "data": cards}


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request) -> dict[str, Any]:
    state = get_state(request)
    if model_id in state.adapters:
        return _adapter_card(state, state.adapters[model_id])
    if model_id not in state.model_names:
        raise APIError(404, f"the model {model_id!r} does not exist", param="model",
                       code="model_not_found")  # fmt: skip
    return _model_card(state, model_id)


def _adapter_card(state: ServerState, lora) -> dict[str, Any]:
    """A LoRA adapter, as vLLM lists one: its root is its folder, its parent the base."""
    card = _model_card(state, lora.lora_name)
    return {**card, "root": lora.lora_path, "parent": state.model_name}


@router.post("/v1/completions")
@abandon_when_gone
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    arrival = arrival_now()
    state = get_state(request)
    model = state.check_model(body.model)
    note_user(request, body)
    params = completion_params(body)
    timeline = state.check_timeline(body.return_timeline)
    refuse_streamed_prompt_logprobs(body.stream, params.prompt_logprobs)
    keep = params.truncate_prompt_tokens
    fim_of = functools.partial(_fim, state)
    if body.suffix:
        fim_of(body, keep)  # a model without FIM tokens: 400 before admission
    group = state.admit(request, body.prompts(), params.n, keep=keep)  # 400/503 before tokenizing
    add_special = body.add_special_tokens is not False
    if body.suffix:  # OpenAI's fill-in-the-middle: the prompt is the text before the gap
        fim = fim_of(body, keep)
        prompts = await group.tokenize(suffix_prompts, state.tokenizer, fim, body.prompts(),
                                       body.suffix, add_special)  # fmt: skip
    else:
        prompts = await group.tokenize(completion_prompts, state.tokenizer, body.prompts(),
                                       add_special)  # fmt: skip
    prompts = salted(truncated(prompts, keep, state.info.max_model_len), body.cache_salt)
    prompts = prioritized(prompts, body.priority)
    prompts = state.with_adapter(prompts, body.model)
    echo_texts: list[str] = []
    if body.echo:
        vocab = state.info.vocab_size
        echo_texts = await state.tokenize(
            lambda: [prompt_text(state.tokenizer, p, vocab) for p in prompts]
        )
    await group.submit(new_id("cmpl"), prompts, params, arrival)
    head = head_of(state, response_id("cmpl", body.request_id), "text_completion", model)
    want_logprobs = params.logprobs is not None
    texts = state.token_texts(body.return_tokens_as_token_ids)

    def echo_of(p: int, out: RequestOutput) -> Echo | None:
        return Echo.of(out, echo_texts[p], want_logprobs) if body.echo else None

    def extras(c: CompletionOutput, out: RequestOutput) -> dict[str, Any]:
        """vLLM's return_token_ids: the choice's token ids and the prompt's."""
        if not body.return_token_ids:
            return {}
        return {"token_ids": list(c.token_ids), "prompt_token_ids": list(out.prompt_token_ids)}

    if body.stream:
        chunks = CompletionChunks(params.n, want_logprobs, texts, body.return_token_ids,
                                  echo_texts if body.echo else None)  # fmt: skip
        prompt_index = {rid: p for p, rid in enumerate(group.request_ids)}
        outputs = (
            (out, chunks.choices(prompt_index[out.request_id], out))
            async for out in group.outputs()
        )
        options = body.stream_options or StreamOptions()
        events = stream_events(group, request, head, outputs, options.include_usage,
                               continuous_usage=options.usage_in_every_chunk,
                               trailer=timelines if timeline else None)  # fmt: skip
        return sse_response(events)

    finals = await collect(group)
    outs = [finals[rid] for rid in group.request_ids]
    choices = []
    for p, out in enumerate(outs):
        for c in out.outputs:
            index = p * params.n + c.index
            choice = completion_choice(index, c, echo_of(p, out), want_logprobs, texts)
            choice.update(extras(c, out))
            choice["prompt_logprobs"] = (  # vLLM's field, null unless asked for
                prompt_logprobs_json(out.prompt_logprobs, texts)
                if params.prompt_logprobs is not None
                else None
            )
            choices.append(choice)
    choices.sort(key=lambda c: c["index"])
    extra = timelines(outs) if timeline else {}
    return JSONResponse({**head, "choices": choices, "usage": usage_of(outs), **extra})


def _fim(state: ServerState, body: CompletionRequest, keep: int | None) -> Any:
    """The model's FIM tokens for a request with `suffix`, which `echo` (OpenAI refuses the
    pair) and `truncate_prompt_tokens` (it would cut the FIM tokens off) cannot join."""
    for name, given in (("echo", body.echo), ("truncate_prompt_tokens", keep is not None)):
        if given:
            raise InvalidRequest(name, f"{name} cannot be combined with suffix")
    return model_fim(state.tokenizer, "suffix")


class CompletionChunks:
    """The choices of a streamed completion's chunks, from the engine's delta outputs: choice
    `p * n + k` is sample k of prompt p; `echo_texts`: each prompt's text, sent first."""

    def __init__(self, n: int, logprobs: bool, texts: TokenText, return_token_ids: bool,
                 echo_texts: list[str] | None):  # fmt: skip
        self.n, self.logprobs, self.texts = n, logprobs, texts
        self.return_token_ids, self.echo_texts = return_token_ids, echo_texts
        self.deltas = ChoiceDeltas(tokens_too=logprobs)
        self.offsets: dict[int, int] = {}  # per choice: its text's length so far (text_offset)

    def choices(self, p: int, out: RequestOutput) -> list[dict[str, Any]]:
        choices = []
        for c in out.outputs:
            if not c.token_ids and c.finish_reason is None:
                continue  # still in prefill: nothing to send yet
            index = p * self.n + c.index
            echo = None
            if self.echo_texts is not None and not self.deltas.started(index):
                echo = Echo.of(out, self.echo_texts[p], self.logprobs)
            d = self.deltas.take(index, c, echo)
            if d is None:
                continue
            lp = None
            if self.logprobs:
                ids, entries = d.token_ids, d.logprobs
                if d.echo is not None:
                    ids, entries = d.echo.token_ids + ids, d.echo.entries + entries
                offset = self.offsets.get(index, 0)
                lp, self.offsets[index] = completion_logprobs(ids, entries, self.texts, offset)
            choice = {
                "index": index,
                "text": d.text,
                "logprobs": lp,
                "finish_reason": d.finish_reason,
                "stop_reason": c.stop_reason if d.finish_reason else None,
            }
            if self.return_token_ids:  # vLLM's: the new token ids, the prompt's with the first
                choice["token_ids"] = d.token_ids
                if d.first:
                    choice["prompt_token_ids"] = list(out.prompt_token_ids)
            choices.append(choice)
        return choices


def timelines(outs: list[RequestOutput]) -> dict[str, Any]:
    """The `timeline` field: one entry per prompt (engine request), in prompt order."""
    return {"timeline": [timeline_json(o) for o in outs]}

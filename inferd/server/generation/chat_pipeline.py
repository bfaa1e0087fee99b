"""One conversation through the engine, whichever API asked for it.

    /v1/chat/completions ─┐
    /v1/responses ────────┼─ translated into a ChatCompletionRequest ─▶ start_chat ─▶ ChatRun
    /v1/messages ─────────┘   (responses/request.py, anthropic/request.py)

`start_chat` does what every chat API does: tool plan (tool_calls.py), SamplingParams and
structured outputs (request_params.py), admission, the chat template (prompts.py), submission.
Each API then shapes the outcome: the chat route its choices itself, the single-choice APIs
from `whole_reply` (content, tool calls, finish) or `reply_deltas` (what each step adds).
Errors raised on the way name the chat request's fields; `renamed` gives them the asking API's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from inferd.errors import InvalidRequest
from inferd.multimodal.image_fetch import fetch_images
from inferd.multimodal.image_parts import split_images
from inferd.outputs import PositionLogprobs, RequestOutput
from inferd.sampling_params import SamplingParams
from inferd.server.generation.context_window import ContextWindow
from inferd.server.generation.prompts import chat_render, prioritized, salted, truncated
from inferd.server.generation.request_params import chat_params, refuse_streamed_prompt_logprobs
from inferd.server.generation.serving import RequestGroup, arrival_now, collect
from inferd.server.http.admission import all_text
from inferd.server.openai.choices import ChoiceDeltas
from inferd.server.openai.protocol import ChatCompletionRequest
from inferd.server.openai.shapes import new_id
from inferd.server.openai.tool_calls import ToolPlan, plan_tools
from inferd.server.state import get_state
from inferd.tools import ToolCall, ToolCallDelta


@dataclass
class ChatRun:
    """A conversation submitted to the engine: its request, tool plan, engine requests."""

    body: ChatCompletionRequest
    plan: ToolPlan
    group: RequestGroup
    params: SamplingParams
    prompt: dict[str, Any]  # {"prompt": text, "prompt_token_ids": ids}


async def start_chat(
    body: ChatCompletionRequest,
    request: Request,
    id_prefix: str,
    context: ContextWindow | None = None,
) -> ChatRun:
    """Plan tools, build SamplingParams, admit, render, tokenize and submit (400/503 before
    anything streams, naming the chat request's fields). `context`: a window the client chose
    (Ollama's num_ctx), checked against the rendered prompt before submission."""
    arrival = arrival_now()
    state = get_state(request)
    plan = plan_tools(body, state.tools)
    params = chat_params(body, plan.spec, special_tokens=plan.special_tokens)
    refuse_streamed_prompt_logprobs(body.stream, params.prompt_logprobs)
    # image parts fetched (listed hosts) and decoded (400s naming the part), then
    # `{"type": "image"}` for the template
    messages = body.template_messages(images=True)
    fetched = await fetch_images(messages, state.api.allowed_media_domains)
    messages, images = split_images(messages, fetched=fetched)
    # 400/503 before rendering: the messages' text bounds the prompt's tokens from below.
    keep = params.truncate_prompt_tokens
    group = state.admit(request, [all_text(messages)], params.n, "messages", keep=keep)
    render = chat_render(
        state.tokenizer, body, messages, plan.tools, state.tools.template, body.add_special_tokens
    )
    prompt = await group.tokenize(render)
    [prompt] = salted(truncated([prompt], keep, state.info.max_model_len), body.cache_salt)
    [prompt] = prioritized([prompt], body.priority)
    [prompt] = state.with_adapter([prompt], body.model)
    if images:  # the engine expands each placeholder the template wrote (multimodal/)
        prompt = {**prompt, "multi_modal_data": {"image": images}}
    if context is not None:
        context.bound(params, len(prompt["prompt_token_ids"]))
    try:
        await group.submit(new_id(id_prefix), [prompt], params, arrival)
    except InvalidRequest as e:
        if e.param == "logprobs" and body.top_logprobs is not None:  # the chat route's name
            message = e.message.replace("logprobs", "top_logprobs", 1)
            raise InvalidRequest("top_logprobs", message) from e
        if (e.param or "").startswith("multi_modal_data"):  # the images came from messages
            raise InvalidRequest("messages", e.message) from e
        raise
    return ChatRun(body, plan, group, params, prompt)


def renamed(error: InvalidRequest, names: dict[str, str]) -> InvalidRequest:
    """`error` naming the asking API's field instead of the chat request's (`names`: chat
    field → API field; a field below a renamed one keeps its path, an indexed message the
    API's field alone, as its items need not be the chat's messages one for one)."""
    param = error.param or ""
    for old, new in names.items():
        if param == old or param.startswith((old + ".", old + "[")):
            rest = "" if old == "messages" else param[len(old) :]
            name = param if param in error.message else old
            message = error.message.replace(name, new + rest if name == param else new, 1)
            out = InvalidRequest(new + rest, message)
            out.code = error.code
            return out
    return error


@dataclass
class Reply:
    """A finished single-choice reply."""

    output: RequestOutput
    content: str  # the text besides the calls ("" when the reply holds only calls)
    calls: list[ToolCall]
    finish_reason: str | None  # the engine's: stop, length, abort
    stop_reason: int | str | None  # the stop string or token that ended it, if one did
    reasoning: str = ""  # the model's reasoning (harmony's analysis channel), if any


async def whole_reply(run: ChatRun) -> Reply:
    out = (await collect(run.group))[run.group.request_ids[0]]
    sample = out.outputs[0]
    parsed = run.plan.reply(sample.text)
    return Reply(out, parsed.content, parsed.calls, sample.finish_reason, sample.stop_reason,
                 parsed.reasoning)  # fmt: skip


@dataclass
class ReplyDelta:
    """What one engine step added to a single-choice reply."""

    output: RequestOutput  # the step's delta output (RequestOutputKind.DELTA)
    content: str
    tool_calls: list[ToolCallDelta]
    token_ids: list[int]  # the new tokens
    logprobs: list[PositionLogprobs]  # theirs, when asked for
    output_tokens: int  # the reply's tokens so far
    finish_reason: str | None  # set on the last delta only
    stop_reason: int | str | None
    reasoning: str = ""


async def reply_deltas(run: ChatRun) -> AsyncIterator[ReplyDelta]:
    """The reply as it grows, reasoning, content and tool-call fragments separated (the parser
    holds back text that may start a call or a marker); the last delta carries the finish."""
    deltas, stream, output_tokens = ChoiceDeltas(tokens_too=True), run.plan.stream(), 0
    async for out in run.group.outputs():
        if not out.outputs:
            continue  # a step with news for the engine's bookkeeping only
        sample = out.outputs[0]
        output_tokens += len(sample.token_ids)
        d = deltas.take(0, sample)
        if d is None:
            continue
        added = stream.take(d.text, final=d.finish_reason is not None)
        yield ReplyDelta(out, added.content, added.tool_calls, d.token_ids, d.logprobs,
                         output_tokens, d.finish_reason, sample.stop_reason,
                         added.reasoning)  # fmt: skip

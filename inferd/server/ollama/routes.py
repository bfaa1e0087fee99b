"""Ollama's generation routes: `POST /api/generate` and `POST /api/chat`, streamed as NDJSON (one
JSON object a line, Ollama's default) or answered whole (`stream: false`).

A request is translated into a chat request (ollama/request.py) and runs as every chat API runs
(chat_pipeline.py): the same admission, tool parsing and structured outputs as
/v1/chat/completions. /api/generate renders its prompt with the model's chat template, unless
`raw: true` (then the prompt is the model's input as it is). A request with no prompt (or no
messages) only asks for the model to be loaded: it is, so the answer is done at once with
`done_reason: "load"`, as Ollama's (with several models the dispatcher loads it first, or
unloads it for `keep_alive: 0`: server/multimodel/keep_alive.py). Streamed tool calls come
whole, on a line before the last, as Ollama sends them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from inferd.errors import InvalidRequest
from inferd.server.generation.chat_pipeline import (
    ChatRun,
    renamed,
    reply_deltas,
    start_chat,
    whole_reply,
)
from inferd.server.generation.context_window import ContextWindow
from inferd.server.generation.prompts import completion_prompts
from inferd.server.generation.request_params import chat_params
from inferd.server.generation.serving import abandon_when_gone, arrival_now
from inferd.server.generation.streaming import guarded
from inferd.server.http.errors import APIError
from inferd.server.ollama.models import served_model
from inferd.server.ollama.options import chat_fields
from inferd.server.ollama.output import (
    created_at,
    done_reason,
    message_json,
    ndjson,
    ndjson_response,
    timings,
    tool_call_json,
)
from inferd.server.ollama.request import (
    CHAT_NAMES,
    ChatBody,
    GenerateBody,
    chat_messages,
    common_fields,
    generate_messages,
    refuse_generate_extras,
    to_chat,
)
from inferd.server.openai.protocol import ChatCompletionRequest
from inferd.server.openai.shapes import new_id
from inferd.server.openai.tool_calls import ToolPlan
from inferd.server.state import get_state

router = APIRouter()


def _ollama_error(e: InvalidRequest) -> InvalidRequest:
    """`e` naming Ollama's fields. Tools with no parser: Ollama has no tool_choice to name."""
    if e.param == "tool_choice" and "--enable-auto-tool-choice" in e.message:
        return InvalidRequest(
            "tools",
            "tools: this server does not read tool calls from replies: start it with "
            "--enable-auto-tool-choice and --tool-call-parser NAME",
        )
    return renamed(e, CHAT_NAMES)


async def _start_raw(
    body: ChatCompletionRequest, request: Request, text: str, window: ContextWindow | None
) -> ChatRun:
    """`raw: true`: the prompt is the model's input as it is (the model's BOS in front, as
    completions get it); the reply is plain text (no tools, no reasoning parser)."""
    arrival = arrival_now()
    state = get_state(request)
    params = chat_params(body)
    group = state.admit(request, [text], params.n, "prompt")
    [prompt] = await group.tokenize(completion_prompts, state.tokenizer, [text])
    [prompt] = state.with_adapter([prompt], body.model)
    if window is not None:
        window.bound(params, len(prompt["prompt_token_ids"]))
    await group.submit(new_id("ollama"), [prompt], params, arrival)
    return ChatRun(body, ToolPlan(), group, params, prompt)


async def _run(fields: dict[str, Any], options: dict | None, request: Request,
               raw: str | None = None) -> ChatRun:  # fmt: skip
    try:
        chat, window = to_chat(fields, options)
        if raw is not None:
            return await _start_raw(chat, request, raw, window)
        return await start_chat(chat, request, "ollama", window)
    except InvalidRequest as e:
        raise _ollama_error(e) from e


def _loaded(model: str, chat: bool, options: dict | None) -> JSONResponse:
    chat_fields(options)  # checked all the same: nothing sent is ignored unseen
    head = {"model": model, "created_at": created_at()}
    reply = {"message": message_json("")} if chat else {"response": ""}
    return JSONResponse({**head, **reply, "done": True, "done_reason": "load"})


@router.post("/api/generate")
@abandon_when_gone
async def generate(body: GenerateBody, request: Request) -> Response:
    arrival = arrival_now()
    state = get_state(request)
    name = served_model(state, body.model)
    fields = common_fields(body, name, state.tools.harmony)
    refuse_generate_extras(body)
    if not body.prompt:
        return _loaded(body.model, False, body.options)
    if body.raw and "reasoning_effort" in fields:
        raise InvalidRequest("think", "think: raw: true returns the model's text as it is")
    fields["messages"] = generate_messages(body)
    run = await _run(fields, body.options, request, body.prompt if body.raw else None)
    head = {"model": body.model}
    if body.stream:
        return ndjson_response(_stream(run, request, head, arrival, chat=False))
    reply = await whole_reply(run)
    generated = len(reply.output.outputs[0].token_ids)
    thinking = {"thinking": reply.reasoning} if reply.reasoning else {}
    return JSONResponse({**head, "created_at": created_at(), "response": reply.content,
                         **thinking, "done": True, "done_reason": done_reason(reply.finish_reason),
                         **timings(reply.output, arrival, generated)})  # fmt: skip


@router.post("/api/chat")
@abandon_when_gone
async def chat(body: ChatBody, request: Request) -> Response:
    arrival = arrival_now()
    state = get_state(request)
    name = served_model(state, body.model)
    fields = common_fields(body, name, state.tools.harmony)
    if not body.messages:
        if body.tools:
            raise InvalidRequest("messages", "messages: tools need a conversation to answer")
        return _loaded(body.model, True, body.options)
    fields.update(messages=chat_messages(body.messages), tools=body.tools)
    run = await _run(fields, body.options, request)
    head = {"model": body.model}
    if body.stream:
        return ndjson_response(_stream(run, request, head, arrival, chat=True))
    reply = await whole_reply(run)
    generated = len(reply.output.outputs[0].token_ids)
    message = message_json(reply.content, reply.reasoning, reply.calls)
    return JSONResponse({**head, "created_at": created_at(), "message": message, "done": True,
                         "done_reason": done_reason(reply.finish_reason),
                         **timings(reply.output, arrival, generated)})  # fmt: skip


def _line(head: dict[str, Any], chat: bool, content: str = "", reasoning: str = "",
          calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    """One line of a stream: its text (and thinking, and tool calls) so far unsent."""
    line = {**head, "created_at": created_at()}
    if chat:
        line["message"] = {"role": "assistant", "content": content}
        if reasoning:
            line["message"]["thinking"] = reasoning
        if calls:
            line["message"]["tool_calls"] = calls
    else:
        line["response"] = content
        if reasoning:
            line["thinking"] = reasoning
    return line


async def _stream(run: ChatRun, request: Request, head: dict[str, Any], arrival: float,
                  chat: bool) -> AsyncIterator[bytes]:  # fmt: skip
    async def lines() -> AsyncIterator[bytes]:
        calls: dict[int, list[str]] = {}  # index → [name, arguments so far]
        async for delta in reply_deltas(run):
            for call in delta.tool_calls:
                name, arguments = calls.setdefault(call.index, [call.name or "", ""])
                calls[call.index] = [name, arguments + call.arguments]
            if delta.content or delta.reasoning:
                yield ndjson({**_line(head, chat, delta.content, delta.reasoning), "done": False})
            if delta.finish_reason is None:
                continue
            if calls:  # Ollama sends each call whole, never its fragments
                whole = [tool_call_json(n, a) for _, (n, a) in sorted(calls.items())]
                yield ndjson({**_line(head, chat, calls=whole), "done": False})
            last = {"done": True, "done_reason": done_reason(delta.finish_reason)}
            last.update(timings(delta.output, arrival, delta.output_tokens))
            yield ndjson({**_line(head, chat), **last})

    def failed(error: APIError) -> list[bytes]:
        return [ndjson({"error": error.message})]

    async for line in guarded(run.group, request, lines(), failed):
        yield line

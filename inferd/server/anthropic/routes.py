"""Anthropic's Messages API: `POST /v1/messages` (plain and streamed) and
`POST /v1/messages/count_tokens`.

A request is translated into a chat request (anthropic/request.py) and runs as every chat API
runs (chat_pipeline.py); replies and events are shaped by messages_output.py. Errors on these
paths have Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`, errors.py),
and the API key may come as `x-api-key`, as Anthropic's clients send it (auth.py).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from inferd.errors import InvalidRequest
from inferd.server.anthropic.output import MessageEvents, message_id, message_json
from inferd.server.anthropic.request import (
    CHAT_NAMES,
    CountTokensRequest,
    MessagesRequest,
    to_chat,
)
from inferd.server.generation.chat_pipeline import (
    ChatRun,
    renamed,
    reply_deltas,
    start_chat,
    whole_reply,
)
from inferd.server.generation.prompts import chat_render
from inferd.server.generation.serving import abandon_when_gone
from inferd.server.generation.streaming import guarded
from inferd.server.http.admission import all_text, text_bytes
from inferd.server.http.errors import APIError
from inferd.server.http.sse import sse_response
from inferd.server.openai.tool_calls import plan_tools
from inferd.server.state import get_state, note_user

router = APIRouter()


@router.post("/v1/messages")
@abandon_when_gone
async def create_message(body: MessagesRequest, request: Request) -> Response:
    state = get_state(request)
    model = state.check_model(body.model)
    chat = to_chat(body)
    note_user(request, chat)
    try:
        run = await start_chat(chat, request, "msg")
    except InvalidRequest as e:
        raise renamed(e, CHAT_NAMES) from e
    mid = message_id()
    if body.stream:
        return sse_response(_stream(run, request, mid, model, body.stop_sequences))
    reply = await whole_reply(run)
    return JSONResponse(message_json(mid, model, reply, body.stop_sequences))


async def _stream(
    run: ChatRun, request: Request, mid: str, model: str, stop_sequences: list[str] | None
):
    events = MessageEvents(mid, model, stop_sequences)

    async def body():
        for event in events.opening(len(run.prompt["prompt_token_ids"])):
            yield event
        async for delta in reply_deltas(run):
            for event in events.thinking(delta.reasoning):
                yield event
            for event in events.text(delta.content):
                yield event
            for call in delta.tool_calls:
                for event in events.call(call.index, call.id, call.name, call.arguments):
                    yield event
            if delta.finish_reason is not None:
                closing = events.closing(delta.finish_reason, delta.stop_reason, delta.output,
                                         delta.output_tokens)  # fmt: skip
                for event in closing:
                    yield event

    def failed(error: APIError) -> list[bytes]:
        return events.failed(error.status, error.message)

    async for event in guarded(run.group, request, body(), failed):
        yield event


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request) -> dict[str, Any]:
    """The prompt's tokens as `/v1/messages` would render it (tools shown as they would be)."""
    state = get_state(request)
    state.check_model(body.model)
    chat = to_chat(body)
    try:
        plan = plan_tools(chat, state.tools)
        messages = chat.template_messages()
        render = chat_render(
            state.tokenizer,
            chat,
            messages,
            plan.tools,
            state.tools.template,
            chat.add_special_tokens,
        )
        prompt = await state.tokenize(render, nbytes=text_bytes(all_text(messages)))
    except InvalidRequest as e:
        raise renamed(e, CHAT_NAMES) from e
    return {"input_tokens": len(prompt["prompt_token_ids"])}

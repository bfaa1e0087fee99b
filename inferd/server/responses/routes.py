"""OpenAI's Responses API: `POST /v1/responses` (plain and streamed), `GET` and `DELETE
/v1/responses/{id}` for stored responses.

A request is translated into a chat request (responses/request.py) and runs as every chat API
runs (chat_pipeline.py); its reply is shaped here, in output.py and events.py. `store` (default
true, as OpenAI's) keeps the response and its conversation in the server's bounded store
(responses_store.py), so that `previous_response_id` can continue it.
"""

from __future__ import annotations

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
from inferd.server.generation.serving import abandon_when_gone
from inferd.server.generation.streaming import guarded
from inferd.server.http.errors import APIError
from inferd.server.http.sse import sse_response
from inferd.server.openai.shapes import chat_logprobs
from inferd.server.responses.events import EventStream
from inferd.server.responses.output import ResponseShape, as_chat_message, items_of
from inferd.server.responses.request import CHAT_NAMES, ResponsesRequest, input_messages, to_chat
from inferd.server.responses.store import ResponseStore, StoredResponse
from inferd.server.state import ServerState, get_state, note_user

router = APIRouter()


def store_of(request: Request) -> ResponseStore:
    return request.app.state.responses


def keeps(body: ResponsesRequest, store: ResponseStore) -> bool:
    """Whether this response is stored: as asked (OpenAI's default: yes), where the server keeps
    any; asking a server that keeps none is a 400."""
    if body.store and store.capacity == 0:
        raise InvalidRequest(
            "store",
            "store: this server keeps no responses (it was started "
            "with --max-stored-responses 0); send store: false",
        )
    return store.capacity > 0 if body.store is None else body.store


def history_of(body: ResponsesRequest, store: ResponseStore) -> list[dict[str, Any]]:
    if body.previous_response_id is None:
        return []
    entry = store.get(body.previous_response_id)
    if entry is None:
        raise InvalidRequest(
            "previous_response_id",
            f"previous_response_id: no stored response {body.previous_response_id!r} (responses "
            "are kept when created with store: true, up to --max-stored-responses, until the "
            "server restarts)",
        )
    return entry.conversation


@router.post("/v1/responses")
@abandon_when_gone
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    state = get_state(request)
    model = state.check_model(body.model)
    note_user(request, body)
    store = store_of(request)
    keep = keeps(body, store)
    conversation = history_of(body, store) + input_messages(body.input)
    chat = to_chat(body, conversation)
    try:
        run = await start_chat(chat, request, "resp")
    except InvalidRequest as e:
        raise renamed(e, CHAT_NAMES) from e
    shape = ResponseShape(body, model, run.params, keep)
    top = body.top_logprobs or 0

    def remember(response: dict[str, Any], items: list) -> None:
        if keep:
            store.put(shape.id, StoredResponse(response, conversation + [as_chat_message(items)]))

    if body.stream:
        return sse_response(_stream(run, request, state, shape, remember, top))
    reply = await whole_reply(run)
    sample = reply.output.outputs[0]
    logprobs = _logprobs(state, run, list(sample.token_ids), list(sample.logprobs or []), top)
    items = items_of(reply.content, reply.calls, logprobs, reply.reasoning)
    status, incomplete = shape.status_of(reply.finish_reason)
    response = shape.json(status, items, reply.output, incomplete)
    remember(response, items)
    return JSONResponse(response)


def _logprobs(state: ServerState, run: ChatRun, ids: list[int], entries: list, top: int) -> list:
    if not run.body.logprobs:
        return []
    return chat_logprobs(ids, entries, state.token_texts(False), top)


async def _stream(
    run: ChatRun,
    request: Request,
    state: ServerState,
    shape: ResponseShape,
    remember: Any,
    top: int,
):
    events = EventStream(shape)

    async def body():
        for event in events.opening():
            yield event
        async for delta in reply_deltas(run):
            logprobs = _logprobs(state, run, delta.token_ids, delta.logprobs, top)
            for event in events.reasoning(delta.reasoning):
                yield event
            for event in events.text(delta.content, logprobs):
                yield event
            for call in delta.tool_calls:
                for event in events.call(call.index, call.id, call.name, call.arguments):
                    yield event
            if delta.finish_reason is not None:
                closing = events.closing(delta.finish_reason, delta.output, delta.output_tokens)
                remember(events.response, events.items)
                for event in closing:
                    yield event

    def failed(error: APIError) -> list[bytes]:
        return events.failed(error.message, error.code)

    async for event in guarded(run.group, request, body(), failed):
        yield event


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str, request: Request) -> dict[str, Any]:
    entry = store_of(request).get(response_id)
    if entry is None:
        raise APIError(
            404,
            f"no stored response {response_id!r}",
            param="response_id",
            code="response_not_found",
        )
    return entry.response


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    if not store_of(request).delete(response_id):
        raise APIError(
            404,
            f"no stored response {response_id!r}",
            param="response_id",
            code="response_not_found",
        )
    return {"id": response_id, "object": "response", "deleted": True}

"""`/v1/chat/completions`, plain and streamed: the conversation rendered by the chat template
(special-token strings in messages kept as text unless `split_special_tokens: false`), tools
(tool_calls.py), structured outputs, `echo` and `continue_final_message` as vLLM has them. The
way to the engine is the one every chat API takes (chat_pipeline.py); `n` choices, logprobs
and the chunk format are this route's."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from inferd.outputs import RequestOutput
from inferd.server.generation.chat_pipeline import start_chat
from inferd.server.generation.serving import abandon_when_gone, collect
from inferd.server.generation.streaming import stream_events
from inferd.server.http.sse import sse_response
from inferd.server.openai.choices import ChoiceDeltas
from inferd.server.openai.completions import head_of, response_id, timelines
from inferd.server.openai.protocol import ChatCompletionRequest, StreamOptions
from inferd.server.openai.shapes import TokenText, chat_logprobs, prompt_logprobs_json, usage_of
from inferd.server.openai.tool_calls import ToolPlan
from inferd.server.state import get_state, note_user

router = APIRouter()


def reply_role(body: ChatCompletionRequest) -> str:
    """The role of the reply (vLLM's rule): a new assistant turn, or, without a generation
    prompt, the role of the message being continued."""
    return "assistant" if body.add_generation_prompt else body.messages[-1].role


def echoed(body: ChatCompletionRequest, role: str) -> str:
    """Chat `echo` (vLLM): the reply is shown after the last message's text when that message
    has the reply's role (e.g. an assistant message being continued)."""
    last = body.messages[-1]
    return last.text() if body.echo and last.role == role else ""


def _logprobs(top: int | None, texts: TokenText, ids: list[int], entries: list) -> Any:
    return None if top is None else {"content": chat_logprobs(ids, entries, texts, top)}


class ChatChunks:
    """The choices of a streamed chat completion's chunks, from the engine's delta outputs:
    each choice's text through its tool-call parser (which may hold text back), its tokens'
    logprobs (`top`: how many alternatives; None: no logprobs)."""

    def __init__(self, plan: ToolPlan, n: int, top: int | None, texts: TokenText,
                 return_token_ids: bool):  # fmt: skip
        self.plan, self.top, self.texts = plan, top, texts
        self.return_token_ids = return_token_ids
        self.deltas = ChoiceDeltas(tokens_too=top is not None)
        self.streams = [plan.stream() for _ in range(n)]

    def choices(self, out: RequestOutput) -> list[dict[str, Any]]:
        choices = []
        for c in out.outputs:
            d = self.deltas.take(c.index, c)
            if d is None:
                continue
            stream = self.streams[c.index]
            delta = stream.feed(d.text, final=d.finish_reason is not None)
            lp = _logprobs(self.top, self.texts, d.token_ids, d.logprobs)
            if not delta and lp is None and d.finish_reason is None:
                continue  # text the tool-call parser holds back
            choice = {
                "index": c.index,
                "delta": delta,
                "logprobs": lp,
                "finish_reason": self.plan.finish_reason(d.finish_reason, stream.called),
                "stop_reason": c.stop_reason if d.finish_reason else None,
            }
            if self.return_token_ids:
                choice["token_ids"] = d.token_ids
            choices.append(choice)
        return choices


@router.post("/v1/chat/completions")
@abandon_when_gone
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    state = get_state(request)
    model = state.check_model(body.model)
    note_user(request, body)
    timeline = state.check_timeline(body.return_timeline)
    run = await start_chat(body, request, "chatcmpl")
    plan, group, params, prompt = run.plan, run.group, run.params, run.prompt
    top = (body.top_logprobs or 0) if body.logprobs else None
    texts = state.token_texts(body.return_tokens_as_token_ids)
    role = reply_role(body)
    echo = echoed(body, role)
    rid = response_id("chatcmpl", body.request_id)

    if body.stream:
        head = head_of(state, rid, "chat.completion.chunk", model)
        chunks = ChatChunks(plan, params.n, top, texts, body.return_token_ids)
        opening = [
            {"index": i, "delta": {"role": role, "content": echo}, "logprobs": None,
             "finish_reason": None}
            for i in range(params.n)
        ]  # fmt: skip
        first = {"prompt_token_ids": prompt["prompt_token_ids"]} if body.return_token_ids else {}
        options = body.stream_options or StreamOptions()
        outputs = ((out, chunks.choices(out)) async for out in group.outputs())
        events = stream_events(group, request, head, outputs, options.include_usage, opening,
                               continuous_usage=options.usage_in_every_chunk,
                               opening_fields=first,
                               trailer=timelines if timeline else None)  # fmt: skip
        return sse_response(events)

    finals = await collect(group)
    out = finals[group.request_ids[0]]
    choices = []
    for c in sorted(out.outputs, key=lambda c: c.index):
        message, called = plan.message(role, c.text)
        if echo:
            message["content"] = echo + (message["content"] or "")
        choice = {
            "index": c.index,
            "message": message,
            "logprobs": _logprobs(top, texts, list(c.token_ids), list(c.logprobs or [])),
            "finish_reason": plan.finish_reason(c.finish_reason, called),
            "stop_reason": c.stop_reason,
        }
        if body.return_token_ids:
            choice["token_ids"] = list(c.token_ids)
        choices.append(choice)
    response = {**head_of(state, rid, "chat.completion", model), "choices": choices,
                "usage": usage_of([out])}  # fmt: skip
    # vLLM's field, null unless asked for (clients read it)
    wanted = params.prompt_logprobs is not None
    response["prompt_logprobs"] = (
        prompt_logprobs_json(out.prompt_logprobs, texts) if wanted else None
    )
    if body.return_token_ids:
        response["prompt_token_ids"] = list(out.prompt_token_ids)
    if timeline:
        response.update(timelines([out]))
    return JSONResponse(response)

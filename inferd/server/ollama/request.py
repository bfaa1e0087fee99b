"""Ollama's `/api/generate` and `/api/chat` requests, read into the chat request every chat API
runs as (chat_pipeline.py).

    messages: content, thinking (assistant)   → content, reasoning_content
              tool_calls (arguments: objects) → tool_calls (arguments: JSON text, ids made up)
              tool_name (tool)                → the tool message, answering the latest call of
                                                that name
    tools                                     → function tools, tool_choice "auto" (Ollama has
                                                no tool_choice)
    format: "json" | a JSON schema            → response_format json_object | json_schema
                                                (strict: only the schema's keys)
    think: true / "low" | "medium" | "high"   → the model's reasoning in `thinking`; only for
                                                models that reason (harmony: gpt-oss), whose
                                                reasoning cannot be turned off (false: 400)
    options                                   → ollama/options.py
    keep_alive                                → checked (keep_alive.py); with several models
                                                the dispatcher's (multimodel/keep_alive.py)
    generate: system, prompt                  → a system and a user message; raw: the prompt
                                                as it is, no template

Images, `template` (Ollama's Go templates), `suffix`, `context` (Ollama's deprecated token
history), logprobs and every field not declared below are a 400 naming them.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from inferd.errors import InvalidRequest
from inferd.server.generation.context_window import ContextWindow
from inferd.server.ollama.keep_alive import check_keep_alive
from inferd.server.ollama.options import OPTION_NAMES, chat_fields
from inferd.server.openai.protocol import Body, ChatCompletionRequest

# The chat request's field → this API's, for errors raised on the way (chat_pipeline.renamed).
CHAT_NAMES = {**OPTION_NAMES, "response_format": "format", "reasoning_effort": "think",
              "tool_choice": "tools"}  # fmt: skip
_MESSAGE_KEYS = {"role", "content", "images", "thinking", "tool_calls", "tool_name"}
_THINK_LEVELS = ("low", "medium", "high")


class OllamaRequest(Body):
    """What /api/generate and /api/chat share."""

    model: str
    format: str | dict[str, Any] | None = None
    options: dict[str, Any] | None = None
    stream: bool = True  # NOTE: Ollama streams unless told not to
    keep_alive: str | int | float | None = None
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class GenerateBody(OllamaRequest):
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None


class ChatBody(OllamaRequest):
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None


def _refuse(param: str, why: str) -> InvalidRequest:
    return InvalidRequest(param, f"unsupported parameter: {param}: {why}")


def _format(value: str | dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None or value == "":
        return None
    if value == "json":
        return {"type": "json_object"}
    if isinstance(value, dict):
        schema = {"name": "format", "schema": value, "strict": True}
        return {"type": "json_schema", "json_schema": schema}
    raise InvalidRequest("format", f'format must be "json" or a JSON schema object, got {value!r}')


def thinking_fields(think: bool | str | None, reasons: bool, model: str) -> dict[str, Any]:
    """The chat fields `think` asks for. `reasons`: the model answers with its reasoning apart
    (harmony), which this server always returns; others have nothing to turn on."""
    if think is None:
        return {}
    if isinstance(think, str) and think not in _THINK_LEVELS:
        raise InvalidRequest(
            "think", f"think must be true, false or one of {', '.join(_THINK_LEVELS)}"
        )
    if not reasons:
        if think is False:
            return {}  # nothing to turn off
        raise InvalidRequest("think", f"{model!r} does not support thinking (think: {think!r})")
    if think is False:
        raise InvalidRequest(
            "think", f"{model!r} always reasons before it answers (harmony); think: false "
            "cannot be honoured: leave it out, or give a level (low, medium, high)",
        )  # fmt: skip
    return {"reasoning_effort": think} if isinstance(think, str) else {}


def common_fields(body: OllamaRequest, model: str, reasons: bool) -> dict[str, Any]:
    """The chat fields of what both routes share (400s naming Ollama's fields)."""
    check_keep_alive(body.keep_alive)
    if body.logprobs or body.top_logprobs is not None:
        raise _refuse("logprobs", "log probabilities are not returned on the Ollama API yet "
                                  "(/v1/chat/completions returns them)")  # fmt: skip
    fields = {"model": model, "stream": body.stream, "response_format": _format(body.format)}
    fields.update(thinking_fields(body.think, reasons, model))
    return fields


def _tool_calls(calls: Any, where: str, turn: int) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise InvalidRequest(where, f"{where} must be a list of tool calls")
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequest(f"{where}[{j}]", f"{where}[{j}] must be {{function: {{name, "
                                                  "arguments}}")  # fmt: skip
        arguments = function.get("arguments") or {}
        if not isinstance(arguments, dict):
            raise InvalidRequest(f"{where}[{j}].function.arguments",
                                 f"{where}[{j}].function.arguments must be an object")  # fmt: skip
        text = json.dumps(arguments, ensure_ascii=False)
        out.append({"id": call.get("id") or f"call_{turn}_{j}", "type": "function",
                    "function": {"name": function["name"], "arguments": text}})  # fmt: skip
    return out


def chat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ollama messages as chat messages. A tool message answers the latest call of its
    tool_name (Ollama's messages carry no call ids; the ids made up here pair them)."""
    out: list[dict[str, Any]] = []
    open_calls: list[dict[str, Any]] = []  # the last assistant turn's calls
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidRequest(where, f"{where} must be an object with a role")
        unknown = sorted(set(message) - _MESSAGE_KEYS)
        if unknown:
            raise _refuse(f"{where}.{unknown[0]}", "not a field of Ollama's messages")
        if message.get("images"):
            raise _refuse(f"{where}.images", "this server reads text only")
        content = message.get("content") or ""
        if not isinstance(content, str):
            raise InvalidRequest(f"{where}.content", f"{where}.content must be a string")
        chat: dict[str, Any] = {"role": message["role"], "content": content}
        if message.get("thinking"):
            chat["reasoning_content"] = message["thinking"]
        if message.get("tool_calls"):
            calls = _tool_calls(message["tool_calls"], f"{where}.tool_calls", i)
            chat["tool_calls"] = open_calls = calls
        if message.get("tool_name"):
            chat["name"] = message["tool_name"]
            answered = [c for c in open_calls if c["function"]["name"] == message["tool_name"]]
            if answered:
                chat["tool_call_id"] = answered[0]["id"]
                open_calls = [c for c in open_calls if c is not answered[0]]
        out.append(chat)
    return out


def generate_messages(body: GenerateBody) -> list[dict[str, Any]]:
    """/api/generate's prompt as a conversation (the model's chat template renders it)."""
    if body.template:
        raise _refuse("template", "Ollama's Go templates cannot be run here; the model's own "
                                  "chat template renders the prompt (raw: true sends it "
                                  "as it is)")  # fmt: skip
    messages = [{"role": "system", "content": body.system}] if body.system else []
    return messages + [{"role": "user", "content": body.prompt or ""}]


def refuse_generate_extras(body: GenerateBody) -> None:
    if body.suffix:
        raise _refuse("suffix", "fill-in-the-middle is not supported on this route")
    if body.context:
        raise _refuse("context", "Ollama's deprecated token history; send the conversation "
                                 "to /api/chat instead")  # fmt: skip
    if body.images:
        raise _refuse("images", "this server reads text only")
    if body.raw and (body.system or body.template):
        name = "system" if body.system else "template"
        raise _refuse(name, "raw: true sends the prompt as it is, with no template to put "
                            f"{name} in")  # fmt: skip


def to_chat(fields: dict[str, Any], options: dict[str, Any] | None) -> tuple[
        ChatCompletionRequest, ContextWindow | None]:  # fmt: skip
    """The chat request of `fields` (messages, tools, ...) and `options`."""
    sampling, window = chat_fields(options)
    fields = {k: v for k, v in {**fields, **sampling}.items() if v is not None}
    try:
        return ChatCompletionRequest.model_validate(fields), window
    except ValidationError as e:  # a value of the wrong type inside a message or a tool
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise InvalidRequest(where, f"{where}: {first.get('msg', 'invalid value')}") from e

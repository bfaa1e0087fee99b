"""`POST /v1/responses` requests (OpenAI's Responses API), read into the chat request every chat
API runs as (chat_pipeline.py).

    input (a string, or items)          → messages: message items (roles user, assistant, system,
                                          developer = system), function_call items as the
                                          assistant's tool_calls, function_call_output as tool
                                          messages; input_text / output_text parts as text;
                                          reasoning items as the assistant's reasoning_content
    instructions                        → a system message first (never carried over by
                                          previous_response_id, as OpenAI has it)
    previous_response_id                → the stored conversation before the input
    max_output_tokens, temperature, top_p, top_logprobs (+ include logprobs) → the same knobs
    text.format                         → response_format (json_schema, json_object)
    tools (function), tool_choice, parallel_tool_calls → the chat's tools, as tool_calls.py has them
    reasoning.effort                    → reasoning_effort (responses/reasoning.py)

What the server cannot do is a 400 naming the field: built-in tools (web search, file search,
computer use, ...), `background`, images, audio and files in the input, and every field not
declared below.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from inferd.errors import InvalidRequest
from inferd.server.openai.protocol import Body, ChatCompletionRequest
from inferd.server.openai.tool_calls import checked_tools
from inferd.server.responses.reasoning import input_reasoning, reasoning_effort

LOGPROBS_INCLUDE = "message.output_text.logprobs"
_TEXT_PARTS = ("input_text", "output_text")
_MESSAGE_KEYS = {"type", "role", "content", "id", "status", "phase"}
_CALL_KEYS = {"type", "call_id", "name", "arguments", "id", "status"}
_OUTPUT_KEYS = {"type", "call_id", "output", "id", "status"}
_FUNCTION_KEYS = {"type", "name", "description", "parameters", "strict"}
# The chat request's field → this API's, for errors raised on the way (chat_pipeline.renamed).
CHAT_NAMES = {
    "messages": "input",
    "prompt": "input",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "response_format.json_schema": "text.format",
    "response_format": "text.format",
    "reasoning_effort": "reasoning.effort",
}


class ResponsesRequest(Body):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    include: list[str] | None = None
    text: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    reasoning: dict[str, Any] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    store: bool | None = None  # None: store when the server keeps responses (OpenAI: true)
    metadata: dict[str, str] | None = None  # returned with the response
    user: str | None = None
    safety_identifier: str | None = None
    # Accepted with the value that describes this server only.
    background: bool | None = None
    truncation: str | None = None
    service_tier: str | None = None
    priority: int | None = None  # vLLM's extension, as on chat (--scheduling-policy priority)

    def refuse_unsupported(self) -> None:
        for name, allowed in (
            ("background", (False,)),
            ("truncation", ("disabled",)),
            ("service_tier", ("auto", "default")),
        ):
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise InvalidRequest(
                    name,
                    f"unsupported parameter: {name}={value!r} (only "
                    f"{' or '.join(map(repr, allowed))} is supported)",
                )
        for key, value in (self.stream_options or {}).items():
            if key != "include_obfuscation" or value not in (False, None):
                raise InvalidRequest(
                    f"stream_options.{key}",
                    f"unsupported parameter: stream_options.{key}={value!r}",
                )
        if self.stream_options is not None and not self.stream:
            raise InvalidRequest("stream_options", "stream_options is only allowed with stream")
        for i, item in enumerate(self.include or []):
            if item != LOGPROBS_INCLUDE:
                raise InvalidRequest(
                    f"include[{i}]",
                    f"unsupported parameter: include[{i}]="
                    f"{item!r} (only {LOGPROBS_INCLUDE!r} is supported)",
                )

    @property
    def wants_logprobs(self) -> bool:
        return self.top_logprobs is not None or LOGPROBS_INCLUDE in (self.include or [])


def _refuse_keys(item: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(item) - allowed)
    if unknown:
        raise InvalidRequest(
            f"{where}.{unknown[0]}", f"unsupported parameter: {where}.{unknown[0]}"
        )


def _text(value: Any, where: str) -> str:
    """A content value as text: a string, or text parts (input_text, output_text) joined."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise InvalidRequest(where, f"{where} must be a string or a list of content parts")
    texts = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise InvalidRequest(
                f"{where}[{j}].type",
                f"{where}[{j}].type: content parts of type {kind!r} are not supported (this server "
                "reads text only: input_text and output_text parts)",
            )
        texts.append(part["text"])
    return "\n".join(texts)


def _with_images(value: Any, where: str) -> str | list[dict[str, Any]]:
    """A user message's content: as `_text`, or, when it holds `input_image` parts, the chat
    API's text and image_url parts in order (the chat pipeline decodes the images)."""
    has_image = isinstance(value, list) and any(
        isinstance(p, dict) and p.get("type") == "input_image" for p in value
    )
    if not has_image:
        return _text(value, where)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(value):
        at = f"{where}[{j}]"
        if isinstance(part, dict) and part.get("type") == "input_image":
            _refuse_keys(part, {"type", "image_url", "detail"}, at)
            if not isinstance(part.get("image_url"), str):
                raise InvalidRequest(f"{at}.image_url", f"{at}.image_url must be a data: URL "
                                     "(file ids are not supported)")  # fmt: skip
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            parts.append({"type": "text", "text": _text([part], where)})
    return parts


def input_messages(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages of `input` (400 naming the item at fault)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            _refuse_keys(item, _MESSAGE_KEYS, where)
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise InvalidRequest(
                    f"{where}.role",
                    f"{where}.role must be user, assistant, system or developer, got {role!r}",
                )
            role = "system" if role == "developer" else role
            content = item.get("content")
            text = (_with_images(content, f"{where}.content") if role == "user"
                    else _text(content, f"{where}.content"))  # fmt: skip
            last = messages[-1] if messages else None
            if role == "assistant" and last is not None and _reasoning_only(last):
                last["content"] = text  # the answer after its reasoning: one turn
            else:
                messages.append({"role": role, "content": text})
        elif kind == "reasoning":
            text = input_reasoning(item, where)
            messages.append({"role": "assistant", "content": "", "reasoning_content": text})
        elif kind == "function_call":
            _refuse_keys(item, _CALL_KEYS, where)
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")},
            }
            if not all(
                isinstance(v, str) for v in (call["id"], item.get("name"), item.get("arguments"))
            ):
                raise InvalidRequest(
                    where, f"{where}: a function_call needs call_id, name and arguments strings"
                )
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)  # one turn: text, then calls
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            _refuse_keys(item, _OUTPUT_KEYS, where)
            if not isinstance(item.get("call_id"), str):
                raise InvalidRequest(f"{where}.call_id", f"{where}.call_id must be a string")
            output = _text(item.get("output"), f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        else:
            raise InvalidRequest(
                f"{where}.type",
                f"{where}.type {kind!r} is not supported (this "
                "server takes message, function_call, function_call_output and "
                "reasoning items)",
            )
    if not messages:
        raise InvalidRequest("input", "input must hold at least one item")
    return messages


def _reasoning_only(message: dict[str, Any]) -> bool:
    return (
        message["role"] == "assistant"
        and "reasoning_content" in message
        and not message["content"]
        and "tool_calls" not in message
    )


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Function tools in the chat's shape; a built-in tool is a 400 naming it."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind != "function":
            raise InvalidRequest(
                f"tools[{i}].type",
                f"tools[{i}].type: built-in tool {kind!r} is not supported (only function tools)",
            )
        _refuse_keys(tool, _FUNCTION_KEYS, f"tools[{i}]")
        function = {k: v for k, v in tool.items() if k in ("name", "description", "parameters")}
        out.append({"type": "function", "function": function})
    return checked_tools(out, "parameters")


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and set(choice) <= {"type", "name"}:
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise InvalidRequest(
        "tool_choice",
        'tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}',
    )


def chat_response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """text.format in the chat's response_format shape (its checks then name text.format)."""
    if text is None:
        return None
    _refuse_keys(text, {"format"}, "text")
    fmt = text.get("format")
    if not isinstance(fmt, dict):
        raise InvalidRequest("text.format", "text.format must be an object")
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
    return fmt


def to_chat(body: ResponsesRequest, conversation: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat request this Responses request runs as; `conversation`: the chat messages of
    the stored conversation it continues (previous_response_id), then of its input."""
    body.refuse_unsupported()
    messages = list(conversation)
    if body.instructions:
        messages.insert(0, {"role": "system", "content": body.instructions})
    fields: dict[str, Any] = {
        "model": body.model,
        "messages": messages,
        "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "logprobs": body.wants_logprobs,
        "top_logprobs": body.top_logprobs if body.wants_logprobs else None,
        "response_format": chat_response_format(body.text),
        "tools": chat_tools(body.tools),
        "tool_choice": chat_tool_choice(body.tool_choice),
        "parallel_tool_calls": body.parallel_tool_calls,
        "reasoning_effort": reasoning_effort(body.reasoning),
        "stream": body.stream,
        "user": body.user,
        "safety_identifier": body.safety_identifier,
        "priority": body.priority,
    }
    try:
        return ChatCompletionRequest.model_validate(
            {k: v for k, v in fields.items() if v is not None}
        )
    except ValidationError as e:  # a value of the wrong type inside an item
        first = e.errors()[0]
        raise InvalidRequest("input", f"input: {first.get('msg', 'invalid value')}") from e

"""Anthropic's Messages API requests (`POST /v1/messages`, `/v1/messages/count_tokens`), read
into the chat request every chat API runs as (chat_pipeline.py).

    system (a string or text blocks)   → a system message first
    messages: text blocks              → the message's text (blocks joined by a line break)
              tool_use (assistant)     → the assistant's tool_calls (input as JSON arguments)
              thinking (assistant)     → the assistant's reasoning_content
              tool_result (user)       → tool messages, before the user's own text; a result
                                         with is_error: true reads "Error: ..."
    max_tokens, stop_sequences, temperature, top_p, top_k → the same knobs (stop, ...)
    tools (name, description, input_schema) → function tools
    tool_choice auto / any / tool / none, disable_parallel_tool_use → auto / required / named /
                                         none, parallel_tool_calls
    metadata.user_id                   → the request's end user (the access log)

Images, documents, redacted thinking, server tools and every field not declared below are a 400
naming them. `cache_control` is accepted on blocks and tools: the server caches prompt prefixes
by itself (--enable-prefix-caching), so the hint needs no action.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from inferd.errors import InvalidRequest
from inferd.server.openai.protocol import Body, ChatCompletionRequest
from inferd.server.openai.tool_calls import checked_tools

# The chat request's field → this API's, for errors raised on the way (chat_pipeline.renamed).
CHAT_NAMES = {"max_completion_tokens": "max_tokens", "stop": "stop_sequences", "prompt": "messages"}
_TEXT_KEYS = {"type", "text", "cache_control", "citations"}
_IMAGE_KEYS = {"type", "source", "cache_control"}
_THINKING_KEYS = {"type", "thinking", "signature", "cache_control"}
_TOOL_USE_KEYS = {"type", "id", "name", "input", "cache_control"}
_RESULT_KEYS = {"type", "tool_use_id", "content", "is_error", "cache_control"}
_TOOL_KEYS = {"type", "name", "description", "input_schema", "cache_control"}
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


class CountTokensRequest(Body):
    model: str | None = None
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    # Accepted with the value that describes this server only.
    service_tier: str | None = None

    def refuse_unsupported(self) -> None:
        if self.service_tier not in (None, "auto", "standard_only"):
            raise InvalidRequest(
                "service_tier",
                f"unsupported parameter: service_tier="
                f"{self.service_tier!r} (only 'auto' or 'standard_only')",
            )
        unknown = sorted(set(self.metadata or {}) - {"user_id"})
        if unknown:
            raise InvalidRequest(
                f"metadata.{unknown[0]}", f"unsupported parameter: metadata.{unknown[0]}"
            )

    @property
    def user(self) -> str | None:
        user = (self.metadata or {}).get("user_id")
        return user if isinstance(user, str) else None


def _refuse_keys(block: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(block) - allowed)
    if unknown:
        raise InvalidRequest(
            f"{where}.{unknown[0]}", f"unsupported parameter: {where}.{unknown[0]}"
        )


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise InvalidRequest(where, f"{where} must be a string or a list of content blocks")
    return content


def _text_of(content: Any, where: str) -> str:
    """Text blocks (or a string) as text; any other block is a 400 naming it."""
    texts = []
    for j, block in enumerate(_blocks(content, where)):
        at = f"{where}[{j}]" if isinstance(content, list) else where
        if block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise InvalidRequest(
                f"{at}.type",
                f"{at}.type: content blocks of type {block.get('type')!r} are not supported here "
                "(text only)",
            )
        _refuse_keys(block, _TEXT_KEYS, at)
        texts.append(block["text"])
    return "\n".join(texts)


def _image_part(block: dict[str, Any], at: str) -> dict[str, Any]:
    """An image block ({type: image, source: {type: base64, media_type, data}}) as the chat
    API's image_url part with a data: URL (decoded by the chat pipeline: 400s name it)."""
    _refuse_keys(block, _IMAGE_KEYS, at)
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") != "base64":
        kind = source.get("type") if isinstance(source, dict) else None
        raise InvalidRequest(f"{at}.source", f"{at}.source: image sources of type {kind!r} "
                             "are not read (base64 only: this server fetches no URLs)")  # fmt: skip
    media, data = source.get("media_type"), source.get("data")
    if not isinstance(media, str) or not isinstance(data, str):
        raise InvalidRequest(f"{at}.source", f"{at}.source needs media_type and data strings")
    return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}


def _message(message: dict[str, Any], i: int) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages (tool results become tool messages)."""
    where = f"messages[{i}]"
    role = message.get("role")
    if role not in ("user", "assistant") or set(message) - {"role", "content"}:
        raise InvalidRequest(where, f"{where} must be {{role: user|assistant, content}}")
    texts, calls, results, thinking = [], [], [], []
    parts: list[dict[str, Any]] = []  # text and images in order, when there are images
    for j, block in enumerate(_blocks(message.get("content"), f"{where}.content")):
        at, kind = f"{where}.content[{j}]", block.get("type")
        if kind == "text":
            texts.append(_text_of([block], f"{where}.content"))
            parts.append({"type": "text", "text": texts[-1]})
        elif kind == "image" and role == "user":
            parts.append(_image_part(block, at))
        elif kind == "tool_use" and role == "assistant":
            _refuse_keys(block, _TOOL_USE_KEYS, at)
            if not isinstance(block.get("id"), str) or not isinstance(block.get("input"), dict):
                raise InvalidRequest(at, f"{at}: a tool_use block needs an id and an input object")
            arguments = json.dumps(block["input"], ensure_ascii=False)
            function = {"name": block.get("name"), "arguments": arguments}
            calls.append({"id": block["id"], "type": "function", "function": function})
        elif kind == "thinking" and role == "assistant":
            _refuse_keys(block, _THINKING_KEYS, at)
            if not isinstance(block.get("thinking"), str):
                raise InvalidRequest(f"{at}.thinking", f"{at}.thinking must be a string")
            thinking.append(block["thinking"])  # the signature is not checked: none is made
        elif kind == "tool_result" and role == "user":
            _refuse_keys(block, _RESULT_KEYS, at)
            text = _text_of(block.get("content", ""), f"{at}.content")
            if block.get("is_error"):
                text = f"Error: {text}"
            results.append(
                {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text}
            )
        else:
            raise InvalidRequest(
                f"{at}.type",
                f"{at}.type: content blocks of type {kind!r} are not "
                f"supported in a {role} message (text, thinking and tool_use from the "
                "assistant, tool_result and image from the user)",
            )
    out = results
    images = len(parts) > len(texts)
    if texts or calls or thinking or images or not results:
        chat: dict[str, Any] = {"role": role, "content": parts if images else "\n".join(texts)}
        if thinking:
            chat["reasoning_content"] = "\n".join(thinking)
        if calls:
            chat["tool_calls"] = calls
        out = out + [chat]
    return out


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Client tools as chat function tools, checked here so that errors name input_schema."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type", "custom") != "custom":
            raise InvalidRequest(
                f"tools[{i}].type",
                f"tools[{i}].type: server tool "
                f"{tool.get('type')!r} is not supported (client tools only)",
            )
        _refuse_keys(tool, _TOOL_KEYS, f"tools[{i}]")
        function = {"name": tool.get("name"), "parameters": tool.get("input_schema")}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return checked_tools(out, "input_schema")


def chat_tool_choice(choice: dict[str, Any] | None) -> tuple[Any, bool]:
    """(the chat's tool_choice, parallel_tool_calls)."""
    if choice is None:
        return None, True
    kind = choice.get("type")
    parallel = not choice.get("disable_parallel_tool_use", False)
    if kind in _CHOICES and set(choice) <= {"type", "disable_parallel_tool_use"}:
        return _CHOICES[kind], parallel
    if kind == "tool" and set(choice) <= {"type", "name", "disable_parallel_tool_use"}:
        return {"type": "function", "function": {"name": choice.get("name")}}, parallel
    raise InvalidRequest(
        "tool_choice",
        "tool_choice must be {type: auto|any|none} or "
        "{type: tool, name}, with disable_parallel_tool_use if wanted",
    )


def conversation(body: CountTokensRequest) -> list[dict[str, Any]]:
    messages = [m for i, message in enumerate(body.messages) for m in _message(message, i)]
    if body.system is not None:
        messages.insert(0, {"role": "system", "content": _text_of(body.system, "system")})
    if not body.messages:
        raise InvalidRequest("messages", "messages must contain at least one message")
    return messages


def to_chat(body: CountTokensRequest) -> ChatCompletionRequest:
    """The chat request this request runs as (count_tokens: only renders it)."""
    choice, parallel = chat_tool_choice(body.tool_choice)
    fields: dict[str, Any] = {
        "model": body.model,
        "messages": conversation(body),
        "tools": chat_tools(body.tools),
        "tool_choice": choice,
        "parallel_tool_calls": parallel,
    }
    if isinstance(body, MessagesRequest):
        body.refuse_unsupported()
        fields.update(
            max_completion_tokens=body.max_tokens,
            stop=body.stop_sequences,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            stream=body.stream,
            user=body.user,
        )
    try:
        return ChatCompletionRequest.model_validate(
            {k: v for k, v in fields.items() if v is not None}
        )
    except ValidationError as e:  # a value of the wrong type inside a message
        first = e.errors()[0]
        raise InvalidRequest("messages", f"messages: {first.get('msg', 'invalid value')}") from e

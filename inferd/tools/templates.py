"""The chat templates that present tools to models whose own template does not, and the message
preparation every tool-aware template expects.

Rendering stays with inferd/tokenizer/chat_template.py; these are template sources for it. A
server with `--tool-call-parser NAME` renders requests that carry tools with the model's own
template when it handles tools, else with the parser's bundled one (`tool_chat_template`).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from inferd.tokenizer.template_files import TEMPLATES_DIR
from inferd.tools import TOOL_PARSERS


def tool_chat_template(parser: str) -> str:
    """The bundled template written for `parser`'s call format (pythonic: Gemma's turns;
    hermes: ChatML's)."""
    if parser not in TOOL_PARSERS or not TOOL_PARSERS[parser].template:
        raise ValueError(f"no tool chat template for parser {parser!r}")
    return (TEMPLATES_DIR / TOOL_PARSERS[parser].template).read_text(encoding="utf-8")


def template_handles_tools(source: str | None) -> bool:
    """Whether a chat template reads the `tools` variable (if not, tools would silently vanish
    from the prompt)."""
    return bool(source) and "tools" in source


# An assistant message's reasoning, by the names clients send it (vLLM's and OpenRouter's) and
# templates read it (Qwen3's reasoning_content, gpt-oss's thinking): each is given all of them.
REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")


def _with_reasoning(message: dict[str, Any], where: str) -> None:
    given = [f for f in REASONING_FIELDS if message.get(f) is not None]
    if not given or message.get("role") != "assistant":
        return
    text = message[given[0]]
    for name in given:
        if not isinstance(message[name], str):
            raise ValueError(f"{where}.{name} must be a string")
        if message[name] != text:
            raise ValueError(f"{where}: {', '.join(given)} differ; send the reasoning once")
    message.update(dict.fromkeys(REASONING_FIELDS, text))


def prepare_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of OpenAI chat messages as templates expect them: each assistant tool call's
    `function.arguments`, a JSON string on the wire, parsed into an object (as HF transformers
    and vLLM hand it to templates), and an assistant's reasoning under each name templates read
    (REASONING_FIELDS). ValueError naming the message when it is malformed."""
    prepared = copy.deepcopy(messages)
    for i, message in enumerate(prepared):
        if isinstance(message, dict):
            _with_reasoning(message, f"messages[{i}]")
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        for j, call in enumerate(calls or []):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
                continue
            where = f"messages[{i}].tool_calls[{j}].function.arguments"
            try:
                arguments = json.loads(function["arguments"]) if function["arguments"] else {}
            except ValueError as e:
                raise ValueError(f"{where} is not valid JSON: {e}") from e
            if not isinstance(arguments, dict):
                raise ValueError(f"{where} must be a JSON object")
            function["arguments"] = arguments
    return prepared

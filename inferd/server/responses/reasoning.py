"""Reasoning in the Responses API: the `reasoning` request field, `reasoning` output items, and
reasoning items sent back as input.

    reasoning: {"effort": "low"|"medium"|"high", "summary": "auto"} → the chat's reasoning_effort
    output: {"type": "reasoning", "id", "summary": [], "content": [{"type": "reasoning_text",
             "text"}], "status"} before the message, for models that reason in the open (harmony)
    input reasoning items → the next assistant turn's reasoning_content

inferd writes no summaries: the reasoning item carries the model's own reasoning in `content`
(as OpenAI does for open-weight models) and an empty `summary`; `summary: "auto"` (the server's
best, which is none) is accepted, "concise" and "detailed" are a 400.
"""

from __future__ import annotations

from typing import Any

from inferd.errors import InvalidRequest

_REQUEST_KEYS = {"effort", "summary", "generate_summary"}
_ITEM_KEYS = {"type", "id", "summary", "content", "encrypted_content", "status"}
_PART_TYPES = {"summary": "summary_text", "content": "reasoning_text"}


def reasoning_effort(reasoning: dict[str, Any] | None) -> str | None:
    """The chat's reasoning_effort from the `reasoning` field (its value is checked there)."""
    if reasoning is None:
        return None
    unknown = sorted(set(reasoning) - _REQUEST_KEYS)
    if unknown:
        raise InvalidRequest(
            f"reasoning.{unknown[0]}", f"unsupported parameter: reasoning.{unknown[0]}"
        )
    for key in ("summary", "generate_summary"):
        if reasoning.get(key) not in (None, "auto"):
            raise InvalidRequest(
                f"reasoning.{key}",
                f"reasoning.{key}={reasoning[key]!r} is not supported: this server writes no "
                "summaries (the reasoning item holds the reasoning itself); use 'auto' or leave "
                "it out",
            )
    effort = reasoning.get("effort")
    if effort is not None and not isinstance(effort, str):
        raise InvalidRequest("reasoning.effort", "reasoning.effort must be a string")
    return effort


def reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [reasoning_part(text)]
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}


def input_reasoning(item: dict[str, Any], where: str) -> str:
    """The text of a reasoning input item: its content parts, else its summary's (what a client
    of OpenAI's own models holds). Encrypted reasoning cannot be read here: a 400."""
    unknown = sorted(set(item) - _ITEM_KEYS)
    if unknown:
        raise InvalidRequest(
            f"{where}.{unknown[0]}", f"unsupported parameter: {where}.{unknown[0]}"
        )
    if item.get("encrypted_content") is not None:
        raise InvalidRequest(
            f"{where}.encrypted_content",
            f"{where}.encrypted_content: encrypted reasoning is not supported (send its text as "
            "content)",
        )
    texts: dict[str, list[str]] = {}
    for key, kind in _PART_TYPES.items():
        parts = item.get(key) or []
        if not isinstance(parts, list):
            raise InvalidRequest(f"{where}.{key}", f"{where}.{key} must be a list")
        for j, part in enumerate(parts):
            if not isinstance(part, dict) or part.get("type") != kind:
                raise InvalidRequest(
                    f"{where}.{key}[{j}]", f"{where}.{key}[{j}] must be a {kind!r} part"
                )
            if not isinstance(part.get("text"), str):
                raise InvalidRequest(
                    f"{where}.{key}[{j}].text", f"{where}.{key}[{j}].text must be a string"
                )
            texts.setdefault(key, []).append(part["text"])
    return "\n".join(texts.get("content") or texts.get("summary") or [])

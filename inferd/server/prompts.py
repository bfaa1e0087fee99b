"""Turning request prompts into token ids (run in a worker thread, never on the engine loop).

Each prompt becomes `{"prompt": text or None, "prompt_token_ids": ids}`, the form the engine
takes without tokenizing again; the engine checks what is left (empty, vocabulary, length).
"""

from __future__ import annotations

from typing import Any

from inferd.engine_client import TokenizerLike
from inferd.errors import InvalidRequest

# Names the server passes itself (or the tokenizer's own parameters): chat_template_kwargs
# cannot set them; a clash would otherwise fail inside the call, as a server error.
_RESERVED = frozenset({"messages", "add_generation_prompt", "self", "tokenize",
                       "split_special_tokens", "chat_template_kwargs"})  # fmt: skip


def checked_template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """`chat_template_kwargs`, unless it names a reserved variable (400)."""
    for name in kwargs or {}:
        if name in _RESERVED:
            raise InvalidRequest(
                "chat_template_kwargs",
                f"chat_template_kwargs: {name!r} is reserved "
                f"(reserved names: {', '.join(sorted(_RESERVED))})",
            )
    return dict(kwargs or {})


def checked_text(param: str, text: str) -> str:
    """`text` if a tokenizer can take it: JSON may carry lone UTF-16 surrogates ("\\ud800"),
    which decode to a Python string but are no text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        message = f"{param} is not valid text: {e.reason} at character {e.start}"
        raise InvalidRequest(param, message) from e
    return text


def completion_prompts(
    tokenizer: TokenizerLike, prompts: list[str | list[int]]
) -> list[dict[str, Any]]:
    out = []
    for prompt in prompts:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequest("prompt", "prompt must not be empty")
            # Completion prompts get the model's special tokens (BOS), as in HF and vLLM.
            ids = tokenizer.encode(checked_text("prompt", prompt))
            out.append({"prompt": prompt, "prompt_token_ids": ids})
        else:
            out.append({"prompt": None, "prompt_token_ids": list(prompt)})
    return out


def salted(prompts: list[dict[str, Any]], cache_salt: str | None) -> list[dict[str, Any]]:
    """The prompts with the request's `cache_salt` (the engine checks it and hashes with it)."""
    if cache_salt is None:
        return prompts
    return [{**p, "cache_salt": cache_salt} for p in prompts]


def prompt_text(tokenizer: TokenizerLike, prompt: dict[str, Any], vocab_size: int) -> str:
    """The prompt as text, for `echo` (token-id prompts are decoded)."""
    if prompt["prompt"] is not None:
        return prompt["prompt"]
    ids = prompt["prompt_token_ids"]
    if any(not 0 <= t < vocab_size for t in ids):
        return ""  # the engine rejects it with the precise message
    return tokenizer.decode(ids, skip_special_tokens=True)


def chat_prompt(
    tokenizer: TokenizerLike,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    template_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Render the chat template and tokenize it. A conversation the template cannot render (no
    template: the message names --chat-template; or the template refuses it) is the request's
    `messages` at fault."""
    extra = checked_template_kwargs(template_kwargs)
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt, **extra)
    except ValueError as e:  # TokenizerLike.apply_chat_template's one way to fail
        raise InvalidRequest("messages", str(e)) from e
    # NOTE: templates write BOS themselves; adding special tokens again would double it.
    ids = tokenizer.encode(checked_text("messages", text), add_special_tokens=False)
    return {"prompt": text, "prompt_token_ids": ids}

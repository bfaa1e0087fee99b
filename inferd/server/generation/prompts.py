"""Turning request prompts into token ids (run in a worker thread, never on the engine loop).

Each prompt becomes `{"prompt": text or None, "prompt_token_ids": ids}`, the form the engine
takes without tokenizing again; the engine checks what is left (empty, vocabulary, length).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from inferd.engine_client import TokenizerLike
from inferd.errors import InvalidRequest
from inferd.tools.templates import prepare_messages

if TYPE_CHECKING:
    from inferd.server.openai.protocol import ChatTemplateFields

# Template variables the server sets from request fields, or names of the tokenizer's own
# parameters: chat_template_kwargs may not set them (they could not be honoured as asked).
_RESERVED = frozenset({"messages", "add_generation_prompt", "tools", "continue_final_message",
                       "split_special_tokens", "chat_template_kwargs", "self",
                       "tokenize"})  # fmt: skip
# OpenAI's reasoning_effort values that gpt-oss (the models whose template reads it) was
# trained with.
REASONING_EFFORTS = ("low", "medium", "high")


def checked_template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """`chat_template_kwargs`, unless it names a reserved variable (400)."""
    reserved = sorted(_RESERVED & (kwargs or {}).keys())
    if reserved:
        raise InvalidRequest(
            "chat_template_kwargs",
            f"chat_template_kwargs may not set {', '.join(reserved)} (reserved names: "
            f"{', '.join(sorted(_RESERVED))}); use the request's own fields",
        )
    return dict(kwargs or {})


def with_reasoning_effort(
    kwargs: dict[str, Any] | None, effort: str | None, source: str | None
) -> dict[str, Any] | None:
    """`chat_template_kwargs` with the request's `reasoning_effort` (OpenAI's field) added as the
    template variable of that name, as vLLM passes it. A template that does not read it would
    silently ignore it: that is a 400, as are other values and a conflicting kwargs entry."""
    if effort is None:
        return kwargs
    if effort not in REASONING_EFFORTS:
        raise InvalidRequest(
            "reasoning_effort",
            f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}",
        )
    if "reasoning_effort" not in (source or ""):
        raise InvalidRequest(
            "reasoning_effort",
            "reasoning_effort is not supported by this model: its chat template does not read "
            "it (gpt-oss's does); leave it out",
        )
    given = (kwargs or {}).get("reasoning_effort", effort)
    if given != effort:
        raise InvalidRequest(
            "reasoning_effort",
            f"reasoning_effort {effort!r} differs from chat_template_kwargs.reasoning_effort "
            f"{given!r}; give one",
        )
    return {**(kwargs or {}), "reasoning_effort": effort}


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
    tokenizer: TokenizerLike, prompts: list[str | list[int]], add_special_tokens: bool = True
) -> list[dict[str, Any]]:
    out = []
    for prompt in prompts:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequest("prompt", "prompt must not be empty")
            # Completion prompts get the model's special tokens (BOS), as in HF and vLLM.
            ids = tokenizer.encode(checked_text("prompt", prompt), add_special_tokens)
            out.append({"prompt": prompt, "prompt_token_ids": ids})
        else:
            out.append({"prompt": None, "prompt_token_ids": list(prompt)})
    return out


def truncated(
    prompts: list[dict[str, Any]], keep: int | None, max_model_len: int
) -> list[dict[str, Any]]:
    """`truncate_prompt_tokens` (vLLM): only the last `keep` tokens of each prompt (-1: of
    max_model_len). The engine applies the same rule; doing it here too lets `echo` show the
    prompt the model saw. A cut prompt's text is dropped (it no longer describes the ids)."""
    if keep is None:
        return prompts
    keep = max_model_len if keep == -1 else keep
    out = []
    for p in prompts:
        ids = p["prompt_token_ids"]
        out.append(p if len(ids) <= keep else {"prompt": None, "prompt_token_ids": ids[-keep:]})
    return out


def salted(prompts: list[dict[str, Any]], cache_salt: str | None) -> list[dict[str, Any]]:
    """The prompts with the request's `cache_salt` (the engine checks it and hashes with it)."""
    if cache_salt is None:
        return prompts
    return [{**p, "cache_salt": cache_salt} for p in prompts]


def prioritized(prompts: list[dict[str, Any]], priority: int | None) -> list[dict[str, Any]]:
    """The prompts with the request's `priority` (vLLM's field; the engine refuses a nonzero
    one unless the server runs --scheduling-policy priority)."""
    if priority is None:
        return prompts
    return [{**p, "priority": priority} for p in prompts]


def prompt_text(tokenizer: TokenizerLike, prompt: dict[str, Any], vocab_size: int) -> str:
    """The prompt as text, for `echo`. Token-id prompts are decoded with their special tokens,
    as the echoed logprobs name each token (`<pad>` is in both), and as vLLM echoes them."""
    if prompt["prompt"] is not None:
        return prompt["prompt"]
    ids = prompt["prompt_token_ids"]
    if any(not 0 <= t < vocab_size for t in ids):
        return ""  # the engine rejects it with the precise message
    return tokenizer.decode(ids, skip_special_tokens=False)


def chat_render(
    tokenizer: TokenizerLike,
    fields: ChatTemplateFields,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    tool_template: Any,
    add_special_tokens: bool | None,
) -> Callable[[], dict[str, Any]]:
    """`chat_prompt` of a request's chat fields, as the call to run off the event loop (the
    chat APIs and /tokenize render alike). The tool template renders when tools are shown, and
    when the conversation holds tool calls or results (tool_choice "none" after a call: the
    model's own template may have no tool turns). `reasoning_effort` (chat requests) is checked
    against the template that renders."""
    with_tools = bool(tools) or any(
        m.get("role") == "tool" or m.get("tool_calls") for m in messages if isinstance(m, dict)
    )
    template = tool_template if with_tools else None
    source = getattr(template, "source", None) or getattr(tokenizer, "chat_template", None)
    kwargs = with_reasoning_effort(
        fields.chat_template_kwargs, getattr(fields, "reasoning_effort", None), source
    )
    return lambda: chat_prompt(
        tokenizer, messages, fields.add_generation_prompt, kwargs,
        continue_final_message=fields.continue_final_message,
        split_special_tokens=fields.split_special_tokens, tools=tools,
        chat_template=template,
        add_special_tokens=bool(add_special_tokens),
    )  # fmt: skip


def chat_prompt(
    tokenizer: TokenizerLike,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    template_kwargs: dict[str, Any] | None = None,
    *,
    continue_final_message: bool = False,
    split_special_tokens: bool = True,
    tools: list[dict[str, Any]] | None = None,
    chat_template: Any = None,
    add_special_tokens: bool = False,
) -> dict[str, Any]:
    """Render the chat template and tokenize it (`Tokenizer.chat_prompt`): with
    `split_special_tokens` (the default) special-token strings typed into messages stay text, so
    user content cannot forge a turn. A conversation the template cannot render (no template:
    the message names --chat-template; or the template refuses it) is the request's `messages`
    at fault. `chat_template`: a template object to render with instead of the model's (the
    tool template); `add_special_tokens`: the tokenizer's own special tokens (BOS) go in front,
    on top of what the template wrote (vLLM's meaning)."""
    extra = checked_template_kwargs(template_kwargs)
    try:
        # Assistant tool calls in the history carry JSON-text arguments: templates get objects.
        messages = prepare_messages(messages)
    except ValueError as e:
        raise InvalidRequest("messages", str(e)) from e
    options: dict[str, Any] = {}
    if continue_final_message:
        options["continue_final_message"] = True
    if chat_template is not None:
        options["chat_template"] = chat_template
    if tools is not None:
        options["tools"] = tools
    try:
        text, ids = tokenizer.chat_prompt(
            messages,
            add_generation_prompt,
            split_special_tokens=split_special_tokens,
            chat_template_kwargs=extra,
            **options,
        )
    except InvalidRequest:
        raise
    except ValueError as e:  # the tokenizer's one way to refuse a conversation
        raise InvalidRequest("messages", str(e)) from e
    if add_special_tokens:
        ids = tokenizer.encode("", add_special_tokens=True) + list(ids)
    return {"prompt": text, "prompt_token_ids": list(ids)}

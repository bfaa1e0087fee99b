"""A chat request's prompt: messages checked, guarded, rendered with the template, encoded.

The order matters: Unicode is checked first (so errors name the message part, not the
rendered prompt); text parts are then joined for templates that want strings
(content_format.py); special-token strings in user-supplied values are marked before the
template runs (text_guard.py), so the template sees the user's text and the encoder can tell
the template's markers from typed ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from tokenizers import Tokenizer as Backend

from inferd.tokenizer.compact_bpe import CompactBPE
from inferd.tokenizer.content_format import STRING, flatten_text_parts
from inferd.tokenizer.text_guard import (
    SpecialTokenGuard,
    check_unicode,
    check_unicode_in,
    encode_unlocked,
    strip_marks,
)

if TYPE_CHECKING:
    from inferd.tokenizer.chat_template import ChatTemplate


class PromptTokenizer(Protocol):
    """What a prompt is built with: tokenizer.py's `Tokenizer`, which builds its chat prompts
    here (so this module names what it reads instead of importing the class)."""

    special_tokens: dict[str, str]  # name → text (bos_token, ...): template variables

    @property
    def backend(self) -> Backend | CompactBPE: ...

    @property
    def special_token_guard(self) -> SpecialTokenGuard: ...


def build_chat_prompt(
    tokenizer: PromptTokenizer,
    template: ChatTemplate | None,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    chat_template_kwargs: dict[str, Any] | None,
    kwargs: dict[str, Any],
    split_special_tokens: bool,
    tokenize: bool,
    continue_final_message: bool = False,
) -> tuple[str, list[int]]:
    """(prompt text, token ids; [] unless `tokenize`). `chat_template_kwargs`, then `kwargs`
    (tools, ...) override the tokenizer's own variables (bos_token, ...) and, like the
    messages, are guarded when `split_special_tokens`. `continue_final_message` ends the prompt
    right after the final message's text (HF's rule), so the model continues that message."""
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
    if template is None:
        raise ValueError(
            "this model has no chat template; pass one with --chat-template "
            "(or the chat_template argument), or send a plain completion prompt"
        )
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
        raise ValueError("chat_template_kwargs must be an object (name → value)")
    user_vars = {**(chat_template_kwargs or {}), **kwargs}
    check_unicode_in(messages, "messages")
    for name, value in user_vars.items():
        check_unicode_in(value, str(name))
    if template.content_format == STRING:
        messages = flatten_text_parts(messages)  # text parts joined: the template wants strings
    marks = 0
    if split_special_tokens:
        guard = tokenizer.special_token_guard
        messages, n_messages = guard.mark(messages)
        user_vars, n_vars = guard.mark(user_vars)
        marks = n_messages + n_vars
    variables = {**tokenizer.special_tokens, **user_vars}
    rendered = template.render(messages, add_generation_prompt, variables)
    check_unicode(rendered, "chat template output")  # the template itself is a file's text
    if continue_final_message:
        rendered = _cut_after_final_message(rendered, messages)
    text = strip_marks(rendered)[0] if marks else rendered
    if not tokenize:
        return text, []
    if marks:
        return text, tokenizer.special_token_guard.encode_marked(rendered)
    return text, encode_unlocked(tokenizer.backend, text, False).ids


def _cut_after_final_message(rendered: str, messages: list[dict[str, Any]]) -> str:
    """`rendered` up to the end of the final message's text (which templates may strip)."""
    content = messages[-1].get("content") if messages and isinstance(messages[-1], dict) else None
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        content = texts[-1] if texts else None
    if not isinstance(content, str) or not content.strip():
        raise ValueError("continue_final_message needs a final message with text to continue")
    for needle in (content, content.strip()):
        end = rendered.rfind(needle)
        if end >= 0:
            return rendered[: end + len(needle)]
    raise ValueError("the chat template does not show the final message's text: cannot continue it")

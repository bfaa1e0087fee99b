"""Text in and out of the engine: tokenizer loading (HF folders, GGUF vocabularies), the
incremental detokenizer for streaming, and sandboxed chat templates.

The chat-template names load on first use (PEP 562): they import Jinja, which most starts do
not need."""

from typing import Any

from inferd.tokenizer.detokenizer import IncrementalDetokenizer
from inferd.tokenizer.template_files import default_chat_template, load_chat_template
from inferd.tokenizer.tokenizer import Tokenizer, checkpoint_tokenizer, load_tokenizer

__all__ = [
    "ChatTemplate",
    "IncrementalDetokenizer",
    "Tokenizer",
    "checkpoint_tokenizer",
    "default_chat_template",
    "load_chat_template",
    "load_tokenizer",
    "render_chat_template",
]


def __getattr__(name: str) -> Any:
    if name in ("ChatTemplate", "render_chat_template"):
        from inferd.tokenizer import chat_template

        return getattr(chat_template, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

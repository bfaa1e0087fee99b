"""Text in and out of the engine: tokenizer loading (HF folders, GGUF vocabularies), the
incremental detokenizer for streaming, and sandboxed chat templates."""

from inferd.tokenizer.chat_template import (
    ChatTemplate,
    default_chat_template,
    load_chat_template,
    render_chat_template,
)
from inferd.tokenizer.detokenizer import IncrementalDetokenizer
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

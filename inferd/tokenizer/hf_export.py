"""The tokenizer as an HF tokenizer folder, and as vLLM's `/tokenizer_info` describes it.

Tools that count or build prompts themselves (lm-eval, aiperf, guidellm) load a tokenizer with
`transformers.AutoTokenizer.from_pretrained(DIR)`. A GGUF file has no such folder, so
`inferd export-tokenizer MODEL DIR` writes one from the tokenizer inferd runs:

    tokenizer.json           the `tokenizers` model itself: vocabulary, merges, normalizer,
                             pre-tokenizer, the post-processor that adds BOS, added tokens
    tokenizer_config.json    tokenizer_class, the named special tokens, the chat template
    special_tokens_map.json  the named special tokens (what older HF versions read)

HF builds `PreTrainedTokenizerFast` around tokenizer.json unchanged (no add_bos_token flags are
written: the post-processor already decides, as it does in inferd), so it tokenizes exactly as
`/tokenize` does. `tokenizer_config` is also what `/tokenizer_info` returns (vLLM's shape: the
tokenizer_config.json contents plus `tokenizer_class`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from tokenizers import Tokenizer as Backend

from inferd.tokenizer.compact_bpe import CompactBPE


class ExportedTokenizer(Protocol):
    """What an export reads: tokenizer.py's `Tokenizer`, which describes itself with
    `tokenizer_config` (so this module names what it reads instead of importing the class)."""

    special_tokens: dict[str, str]  # name → text (bos_token, ...)

    @property
    def backend(self) -> Backend | CompactBPE: ...

    @property
    def chat_template(self) -> str | None: ...


TOKENIZER_CLASS = "PreTrainedTokenizerFast"  # HF's class for a bare tokenizer.json (4 and 5)
FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def special_tokens_map(tok: ExportedTokenizer) -> dict[str, str]:
    return dict(tok.special_tokens)


def tokenizer_config(tok: ExportedTokenizer, model_max_length: int | None = None) -> dict[str, Any]:
    """tokenizer_config.json's contents: the class, the named special tokens, the added tokens
    (id → content and flags, as HF writes them), the chat template, and the longest sequence
    when known (the served model's max_model_len)."""
    added = tok.backend.get_added_tokens_decoder()
    config: dict[str, Any] = {
        "tokenizer_class": TOKENIZER_CLASS,
        **special_tokens_map(tok),
        # NOTE: inferd's decode keeps the spaces as the tokens have them; HF must not tidy.
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(i): {
                "content": t.content,
                "lstrip": t.lstrip,
                "rstrip": t.rstrip,
                "normalized": t.normalized,
                "single_word": t.single_word,
                "special": t.special,
            }
            for i, t in sorted(added.items())
        },
    }
    if tok.chat_template:
        config["chat_template"] = tok.chat_template
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    return config


def export_tokenizer(tok: ExportedTokenizer, directory: str | Path) -> list[Path]:
    """Write the three files into `directory` (created if needed; files of these names are
    replaced); returns their paths."""
    folder = Path(directory)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"DIR: {folder} exists and is not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / name for name in FILES]
    tok.backend.save(str(paths[0]))
    for path, content in zip(paths[1:], (tokenizer_config(tok), special_tokens_map(tok))):
        path.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", "utf-8")
    return paths

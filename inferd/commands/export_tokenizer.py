"""`inferd export-tokenizer MODEL DIR`: the model's tokenizer as an HF tokenizer folder.

    inferd export-tokenizer gemma-3-270m ./gemma-tokenizer
    python -c "import transformers; transformers.AutoTokenizer.from_pretrained('./gemma-tokenizer')"

Tools that tokenize on the client side (lm-eval's `tokenizer_backend=huggingface`, aiperf,
guidellm) need such a folder, and a GGUF file has none. The folder tokenizes exactly as the
server's `/tokenize` does, and carries the chat template the server renders with
(inferd/tokenizer/hf_export.py). Only the tokenizer is read: no weights are loaded.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", metavar="MODEL", help="a model name (inferd models), a GGUF file or an HF folder"
    )
    parser.add_argument(
        "directory",
        metavar="DIR",
        type=Path,
        help="the folder to write (created if needed; its tokenizer files are replaced)",
    )
    parser.add_argument(
        "--chat-template",
        default=None,
        help="chat template file or inline Jinja to export instead of the model's, as "
        "`inferd serve --chat-template` would serve it (default: the model's own)",
    )


def run(args: argparse.Namespace) -> int:
    from inferd.loader.short_name import resolve
    from inferd.tokenizer import load_chat_template, load_tokenizer
    from inferd.tokenizer.chat_template import ChatTemplate
    from inferd.tokenizer.hf_export import export_tokenizer

    template = load_chat_template(args.chat_template) if args.chat_template else None
    if template is not None:
        ChatTemplate(template)  # compiles: a syntax error is named before anything is written
    path = resolve(args.model) or Path(args.model)
    tokenizer = load_tokenizer(path, chat_template=template)
    for written in export_tokenizer(tokenizer, args.directory):
        print(written)
    return 0

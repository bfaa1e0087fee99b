"""The tokenizer files of an HF model folder besides tokenizer.json: tokenizer_config.json,
generation_config.json, chat_template.jinja / chat_template.json.

They are untrusted input: a file that is not JSON, or a field of the wrong type, is a
`ModelLoadError` naming the file, never a KeyError or a TypeError from deep inside.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as Backend

from inferd.errors import ModelLoadError

NAMED_SPECIALS = ("bos_token", "eos_token", "unk_token", "pad_token")
_ADDED_TOKEN_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")


def read_json(path: Path) -> dict[str, Any]:
    """The file's JSON object; {} when the file is absent or holds another JSON value."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError includes UnicodeDecodeError
        raise ModelLoadError(f"{path}: cannot read JSON ({e})") from e
    return value if isinstance(value, dict) else {}


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: cannot read text ({e})") from e


def token_content(value: Any) -> str | None:
    """A special token in tokenizer_config.json: a string or an AddedToken-like dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def token_ids(value: Any, source: Path) -> list[int]:
    """A token id or a list of them (generation_config.json's eos_token_id), checked."""
    values = [] if value is None else value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ModelLoadError(f"{source}: eos_token_id must be a token id or a list of them")
    return values


def add_config_tokens(backend: Backend, config: dict[str, Any], source: Path) -> None:
    """Tokens tokenizer_config.json declares that tokenizer.json lacks (HF adds them too)."""
    declared = config.get("added_tokens_decoder") or {}
    if not isinstance(declared, dict):
        raise ModelLoadError(f"{source}: added_tokens_decoder must be an object (id → token)")
    entries = []
    for key, entry in declared.items():
        if not (isinstance(key, str) and key.isdigit()) or not isinstance(entry, dict):
            raise ModelLoadError(
                f"{source}: added_tokens_decoder entry {key!r} must map a numeric id to a token"
            )
        if not isinstance(entry.get("content"), str) or not entry["content"]:
            raise ModelLoadError(f"{source}: added_tokens_decoder[{key!r}] has no content string")
        entries.append((int(key), entry))
    for _, entry in sorted(entries, key=lambda item: item[0]):
        if backend.token_to_id(entry["content"]) is None:
            options = {k: bool(entry[k]) for k in _ADDED_TOKEN_FLAGS if k in entry}
            backend.add_tokens([AddedToken(entry["content"], **options)])
    for name in NAMED_SPECIALS:
        token = token_content(config.get(name))
        if token and backend.token_to_id(token) is None:
            backend.add_special_tokens([AddedToken(token, special=True, normalized=False)])


def hf_chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    """HF's precedence: chat_template.jinja, then chat_template.json, then the config's key."""
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return read_text(jinja_file)
    template = read_json(folder / "chat_template.json").get("chat_template")
    if template is None:
        template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the "default" one serves plain chat
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) and template else None

"""Where chat templates come from: `--chat-template` (a file or inline text) and the templates
that ship with the package. Plain file reading, kept apart from chat_template.py so that loading
a tokenizer does not import Jinja (a tenth of a second at every start) until a template renders."""

from __future__ import annotations

import json
from pathlib import Path

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
_DEFAULT_TEMPLATES = {"gemma": "gemma.jinja", "gemma2": "gemma.jinja", "gemma3": "gemma.jinja"}


def load_chat_template(value: str) -> str:
    """The template named by `--chat-template`: a file path (.jinja, or .json holding a
    "chat_template" key) or the template text itself."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError("--chat-template: expected a file path or a Jinja template, got nothing")
    path = Path(value).expanduser()
    try:
        is_file = "\n" not in value and path.is_file()
    except OSError:  # e.g. a long inline template is not a valid file name
        is_file = False
    if is_file:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            try:
                text = json.loads(text)["chat_template"]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(
                    f"--chat-template: {path} is not a JSON object with a 'chat_template' key"
                ) from e
        return text
    if "{{" in value or "{%" in value:
        return value
    raise ValueError(
        f"--chat-template: {value!r} is neither an existing file nor a Jinja template "
        "(inline templates contain '{{' or '{%')"
    )


def default_chat_template(architecture: str) -> str | None:
    """The bundled template for architectures whose files often lack one (Gemma GGUFs)."""
    name = _DEFAULT_TEMPLATES.get(architecture)
    return (TEMPLATES_DIR / name).read_text(encoding="utf-8") if name else None

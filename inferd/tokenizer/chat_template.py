"""Chat templates: turning a list of messages into the prompt text a chat model was trained on.

Templates are Jinja programs that ship with model files, i.e. untrusted code, so they run in
Jinja's immutable sandbox (no attribute access to Python internals, no mutation of the inputs),
with the conventions HF transformers established for them: `trim_blocks`/`lstrip_blocks`, the
`raise_exception`, `strftime_now` and `tojson` helpers, `{% generation %}` blocks and loop
controls. Every failure surfaces as a ValueError (HTTP 400), never as a Jinja exception.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from inferd.tokenizer.content_format import detect_content_format

# Names a variable may not take: the render arguments themselves, and Jinja's `self` (which
# would silently stay the template's block reference).
RESERVED_VARIABLES = ("add_generation_prompt", "messages", "self")


class TemplateRaised(TemplateError):
    """Raised by a template's own `raise_exception(...)`: the conversation is not acceptable."""


class _Sandbox(ImmutableSandboxedEnvironment):
    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        # Jinja's default renders a blocked attribute as an empty string; a template that
        # reaches for internals is hostile or broken, and both deserve a clear error instead.
        raise SecurityError(
            f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is not "
            "allowed in a chat template"
        )


class _GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks in HF;
    for inference it only renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return caller()


def _refuse_private(names: Any) -> None:
    for name in names:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"chat templates may not use private names like {name!r}")


class _SafeNamespace(Namespace):
    """`namespace()` that refuses underscore names, which could shadow object internals."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        attrs = dict(*args, **kwargs)
        _refuse_private(attrs)
        super().__init__(attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _refuse_private([name])
        super().__setitem__(name, value)


class _DictFactory:
    """Stands in for the `dict` global: builds dicts, but is not the `dict` type itself, so a
    template cannot walk from it to `type`/`object` and their methods."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, keys: Any, value: Any = None) -> dict:
        return dict.fromkeys(keys, value)


def _raise_exception(message: str) -> None:
    raise TemplateRaised(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own filter HTML-escapes (<, >, &, '), which would change what the model sees.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> jinja2.Environment:
    env = _Sandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(
        raise_exception=_raise_exception,
        strftime_now=_strftime_now,
        namespace=_SafeNamespace,
        dict=_DictFactory(),
    )
    return env


class ChatTemplate:
    """A compiled chat template. Compile once (per tokenizer), render per request."""

    def __init__(self, source: str):
        if not isinstance(source, str) or not source:
            raise ValueError("chat_template must be a non-empty Jinja template string")
        self.source = source
        env = _environment()
        try:
            self._template = env.from_string(source)
            # NOTE: "string" or "openai" (content_format.py): whether messages' content may
            # reach this template as a list of parts, or must be joined into a string first.
            self.content_format = detect_content_format(env.parse(source))
        except TemplateSyntaxError as e:
            raise ValueError(f"chat template syntax error (line {e.lineno}): {e.message}") from e

    def render(
        self,
        messages: list[dict[str, Any]],
        /,
        add_generation_prompt: bool = True,
        variables: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> str:
        """Render `messages`; `variables` and `kwargs` (bos_token, tools, ...) reach the
        template. A variable named like a render argument is a ValueError naming it."""
        if not isinstance(messages, list):
            raise ValueError(f"messages must be a list of dicts, got {type(messages).__name__}")
        context = {**(variables or {}), **kwargs}
        for name in RESERVED_VARIABLES:
            if name in context:
                raise ValueError(
                    f"chat template variable {name!r} (e.g. in chat_template_kwargs) is "
                    f"reserved; reserved names: {', '.join(RESERVED_VARIABLES)}"
                )
        context.update(messages=messages, add_generation_prompt=add_generation_prompt)
        try:
            return self._template.render(context)
        except TemplateRaised as e:
            raise ValueError(f"the chat template rejected the messages: {e.message}") from e
        except TemplateError as e:
            raise ValueError(f"chat template error: {e.message or type(e).__name__}") from e
        except Exception as e:  # noqa: BLE001 - untrusted template code may fail in any way
            raise ValueError(f"chat template failed: {type(e).__name__}: {e}") from e


def render_chat_template(
    source: str,
    messages: list[dict[str, Any]],
    /,
    add_generation_prompt: bool = True,
    **variables: Any,
) -> str:
    """One-off render (compiles every call; keep a ChatTemplate to render repeatedly)."""
    return ChatTemplate(source).render(messages, add_generation_prompt, variables)

"""What a request asks its output to look like: vLLM's `StructuredOutputsParams`.

Exactly one kind per request: a JSON schema (`json`), any JSON object (`json_object`), a regular
expression (`regex`), one of a list of strings (`choice`), or a context-free grammar (`grammar`,
in Lark or GBNF syntax). Everything checkable without compiling is checked here, when the object
is built, and raises InvalidRequest (a ValueError) naming the field; a spec that fails to compile
(a schema keyword llguidance cannot honour, a regex syntax error) raises `InvalidGrammarError`
(an InvalidRequest too) from the compiler.
Like sampling_params.py, this module imports neither torch nor llguidance, so the HTTP layer can
validate requests without them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from typing import Any

from inferd.errors import InvalidRequest

# The spec kinds, in the order vLLM lists them; `kind` returns one of these.
KINDS = ("json", "regex", "choice", "grammar", "json_object")
_FIELD = "structured_outputs"


class InvalidGrammarError(InvalidRequest):
    """A structured-output spec that cannot be compiled: the server answers HTTP 400 with the
    message, which names the field and the problem; `param` is that field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(param, message)


@dataclass(frozen=True)
class StructuredOutputsParams:
    json: str | dict[str, Any] | None = None  # a JSON schema, as a dict or its JSON text
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # Lark (llguidance's dialect) or GBNF (llama.cpp's)
    json_object: bool | None = None  # True: any JSON object
    # JSON kinds only: no whitespace between tokens (only the separators ", " and ": " are not
    # flexible).
    disable_any_whitespace: bool = False
    # Where a schema leaves `additionalProperties` out: None (the default) and True treat it as
    # false, as vLLM's default backend (xgrammar, strict_mode) does, so a small model cannot
    # write invented keys until max_tokens; False keeps JSON Schema's own meaning (any key).
    disable_additional_properties: bool | None = None
    # The request field the spec came from, for error messages: "structured_outputs" (then
    # errors name "structured_outputs.<kind>"), or e.g. "guided_regex", "response_format".
    origin: str = dataclasses.field(default=_FIELD, compare=False, repr=False)

    def __post_init__(self) -> None:
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise InvalidRequest(
                self.origin,
                f"{self.origin} must set exactly one of {', '.join(KINDS)}; "
                f"got {', '.join(given) if given else 'none'}",
            )
        flags = (("disable_any_whitespace", bool), ("disable_additional_properties", bool | None))
        for flag, kind in flags:
            if not isinstance(getattr(self, flag), kind):
                value = getattr(self, flag)
                name = f"{self.origin}.{flag}"
                raise InvalidRequest(name, f"{name} must be a boolean, got {value!r}")
        if self.json_object is not None and not isinstance(self.json_object, bool):
            name = self.field_name("json_object")
            raise InvalidRequest(name, f"{name} must be a boolean, got {self.json_object!r}")
        if self.json is not None:
            # Stored as a dict: one canonical form for the cache key and the compiler.
            object.__setattr__(self, "json", _schema_dict(self.json, self.field_name("json")))
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                field = self.field_name(name)
                raise InvalidRequest(field, f"{field} must be a non-empty string, got {value!r}")
        if self.choice is not None:
            object.__setattr__(self, "choice", _choices(self.choice, self.field_name("choice")))

    def field_name(self, kind: str | None = None) -> str:
        """The request field to name in an error about this spec's `kind` (default: its own)."""
        if self.origin != _FIELD:
            return self.origin
        return f"{_FIELD}.{kind or self.kind}"

    @property
    def closes_objects(self) -> bool:
        """Whether an object schema without `additionalProperties` allows only its keys."""
        return self.disable_additional_properties is not False

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @functools.cached_property
    def key(self) -> tuple[str, str]:
        """(kind, canonical spec text + options): equal keys compile to the same grammar.
        Computed once (a large schema's canonical JSON costs; every compile lookup asks)."""
        spec: Any = getattr(self, self.kind)
        if self.kind in ("json", "choice", "json_object"):
            text = json.dumps(spec, sort_keys=True, ensure_ascii=False)
        else:
            text = spec
        if self.kind in ("json", "json_object"):
            text += f"|ws={not self.disable_any_whitespace}|ap={self.closes_objects}"
        # NOTE: the origin is part of the key because a cached compile error names it.
        return self.kind, f"{text}|origin={self.origin}"

    @classmethod
    def from_dict(cls, value: Any) -> StructuredOutputsParams:
        """From a request's JSON object (unknown keys are refused, naming them)."""
        if isinstance(value, StructuredOutputsParams):
            return value
        if not isinstance(value, dict):
            raise InvalidRequest(_FIELD, f"{_FIELD} must be an object, got {type(value).__name__}")
        known = {f.name for f in dataclasses.fields(cls)} - {"origin"}
        unknown = sorted(set(value) - known)
        if unknown:
            supported = ", ".join(sorted(known))
            raise InvalidRequest(
                f"{_FIELD}.{unknown[0]}",
                f"unsupported parameter: {_FIELD}.{unknown[0]} (supported: {supported})",
            )
        return cls(**value)


def _schema_dict(schema: Any, name: str) -> dict[str, Any]:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise InvalidRequest(name, f"{name} is not valid JSON: {e}") from e
    # JSON Schema allows `true` (anything) too, but a reply constrained to "anything" is what an
    # unconstrained request already gets; a dict keeps the compiler's input one shape.
    if not isinstance(schema, dict):
        raise InvalidRequest(
            name,
            f"{name} must be a JSON schema object (or its JSON text), got {type(schema).__name__}",
        )
    return schema


def _choices(choices: Any, name: str) -> list[str]:
    if not isinstance(choices, list | tuple) or not choices:
        raise InvalidRequest(name, f"{name} must be a non-empty list of strings, got {choices!r}")
    for c in choices:
        if not isinstance(c, str) or not c:
            raise InvalidRequest(name, f"{name} entries must be non-empty strings, got {c!r}")
    return list(choices)

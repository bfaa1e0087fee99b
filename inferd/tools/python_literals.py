"""Lark rules for Python literals that satisfy a JSON schema (pythonic tool-call arguments).

JSON and Python literals agree on strings (with plain escapes), numbers, lists and string-keyed
dicts; they differ on true/false/null (True/False/None). So the leaves that agree (strings,
numbers, with all their constraints) are handed to llguidance as inline JSON schemas (`%json`),
and the structure (booleans, null, arrays, objects, enums, unions) is written as rules here.
Objects list their declared keys in schema order, required ones always, optional ones possibly
left out, without the sequence rules growing faster than the number of keys.

Schema features with no Python-literal rendering here ($ref, allOf, not, if/then, ...) are a
ValueError naming the function and the keyword: such tools need the hermes format.
"""

from __future__ import annotations

import json
from typing import Any

_UNSUPPORTED = (
    "$ref", "allOf", "not", "if", "then", "else", "patternProperties", "prefixItems",
    "dependentSchemas", "dependentRequired", "unevaluatedProperties", "propertyNames",
    "contains", "uniqueItems",
)  # fmt: skip
# Escapes a JSON string literal may use that mean the same in a Python one (no \/, no \u).
_STRING_OPTIONS = {"json_allowed_escapes": 'nrtbf"\\'}
_STRING_KEYS = ("minLength", "maxLength", "pattern", "format")
_NUMBER_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


def python_literal(value: Any) -> str:
    """The Python source of a JSON value."""
    if value is None or isinstance(value, bool):
        return {None: "None", True: "True", False: "False"}[value]
    if isinstance(value, str | int | float):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        items = (
            f"{json.dumps(k, ensure_ascii=False)}: {python_literal(v)}" for k, v in value.items()
        )
        return "{" + ", ".join(items) + "}"
    raise ValueError(f"{value!r} is not a JSON value")


def _lark_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


class PythonLiteralRules:
    """Accumulates numbered Lark rules; `lines` is the grammar text after the start rule."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._any: str | None = None

    def add(self, body: str) -> str:
        name = f"r{len(self.lines)}"
        self.lines.append(f"{name}: {body}")
        return name

    def value(self, schema: Any, where: str) -> str:
        """A rule matching the Python literals valid against `schema`."""
        if schema is True or schema == {}:
            return self.any_value()
        if not isinstance(schema, dict):
            raise ValueError(f"{where}: a schema must be an object, got {schema!r}")
        for key in _UNSUPPORTED:
            if key in schema:
                raise ValueError(
                    f"{where}: JSON schema keyword {key!r} is not supported for pythonic tool "
                    "calls (use the hermes parser)"
                )
        if "const" in schema:
            return self.add(_lark_string(python_literal(schema["const"])))
        if "enum" in schema:
            return self.add(" | ".join(_lark_string(python_literal(v)) for v in schema["enum"]))
        for key in ("anyOf", "oneOf"):
            if key in schema:
                subs = [self.value(s, f"{where}.{key}[{i}]") for i, s in enumerate(schema[key])]
                return self.add(" | ".join(subs))
        kind = schema.get("type")
        if isinstance(kind, list):
            subs = [self.value({**schema, "type": t}, where) for t in kind]
            return self.add(" | ".join(subs))
        if kind is None:
            kind = "object" if "properties" in schema else "array" if "items" in schema else None
        if kind is None:
            return self.any_value()
        if kind in ("string", "integer", "number"):
            keys = _STRING_KEYS if kind == "string" else _NUMBER_KEYS
            leaf = {"type": kind, **{k: schema[k] for k in keys if k in schema}}
            if kind == "string":
                leaf["x-guidance"] = _STRING_OPTIONS
            return self.add(f"%json {json.dumps(leaf)}")
        if kind == "boolean":
            return self.add('"True" | "False"')
        if kind == "null":
            return self.add('"None"')
        if kind == "array":
            return self._array(schema, where)
        if kind == "object":
            if not schema.get("properties"):
                return self._any_dict()
            return self.add(f'"{{" {self.members(schema, where, keyword=False)} "}}"')
        raise ValueError(f"{where}: unknown JSON schema type {kind!r}")

    def members(self, schema: dict[str, Any], where: str, keyword: bool) -> str:
        """An expression for an object's members in schema order (`key=value` for keyword
        arguments, `"key": value` for dict entries); "" when it has none."""
        properties = schema.get("properties") or {}
        required = set(schema.get("required") or ())
        unknown = required - set(properties)
        if unknown:
            raise ValueError(f"{where}: required {sorted(unknown)} missing from properties")
        items = []
        for key, sub in properties.items():
            if keyword and not key.isidentifier():
                raise ValueError(f"{where}: parameter {key!r} cannot be a Python keyword argument")
            prefix = f"{key}=" if keyword else f"{json.dumps(key, ensure_ascii=False)}: "
            value = self.value(sub, f"{where}.{key}")
            items.append((f"{_lark_string(prefix)} {value}", key in required))
        # NOTE: `rest` matches what may follow once something was written (each item after a
        # ", "); `first` what may come when nothing was written yet. Built back to front, each
        # refers to the next by name, so the rules grow linearly with the number of keys.
        rest, first = "", ""
        for item, needed in reversed(items):
            comma_item = f'", " {item}'
            new_rest = self.add(f"{comma_item if needed else f'({comma_item})?'} {rest}".strip())
            if needed:
                new_first = self.add(f"{item} {rest}".strip())
            elif first:
                new_first = self.add(f"({item} {rest}) | {first}".strip())
            else:
                new_first = self.add(f"({item} {rest})?".strip())
            rest, first = new_rest, new_first
        return first

    def _array(self, schema: dict[str, Any], where: str) -> str:
        item = self.value(schema.get("items", True), f"{where}[]")
        low, high = int(schema.get("minItems", 0)), schema.get("maxItems")
        if high is not None and int(high) < low:
            raise ValueError(f"{where}: maxItems is below minItems")
        if high is not None and int(high) == 0:
            return self.add('"[" "]"')
        more_low = max(low - 1, 0)
        more = f"{{{more_low},{'' if high is None else int(high) - 1}}}"
        some = f'"[" {item} (", " {item}){more} "]"'
        return self.add(some if low > 0 else f'"[" "]" | {some}')

    def any_value(self) -> str:
        if self._any is None:
            string = json.dumps({"type": "string", "x-guidance": _STRING_OPTIONS})
            number = json.dumps({"type": "number"})
            self._any = "any"
            self.lines.append(
                f'any: %json {string} | %json {number} | "True" | "False" | "None" '
                '| "[" (any (", " any)*)? "]" | "{" (any_kv (", " any_kv)*)? "}"'
            )
            self.lines.append(f'any_kv: %json {string} ": " any')
        return self._any

    def _any_dict(self) -> str:
        self.any_value()
        return self.add('"{" (any_kv (", " any_kv)*)? "}"')

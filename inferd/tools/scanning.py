"""Finding where a value ends in text that is still arriving, and reading values safely.

Both parsers read text a token at a time, so every scan answers one of three things: the value
ends here, the text ends before the value does (wait for more), or the text cannot be a value
(`Invalid`). Python values are read with `ast.literal_eval` (literals only: nothing is ever
evaluated) and must be expressible in JSON, since arguments travel as JSON.
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CLOSERS = {"(": ")", "[": "]", "{": "}"}


class Invalid(ValueError):
    """The text is not (the beginning of) what the parser expects."""


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def value_end(text: str, start: int, stops: str, python: bool) -> int | None:
    """The index of the first character in `stops` at nesting depth 0 after the value that
    starts at `start`: the value is text[start:index]. None when the text ends first."""
    quotes = "'\"" if python else '"'
    stack: list[str] = []
    i = start
    while i < len(text):
        c = text[i]
        if c in quotes:
            end = string_end(text, i, python)
            if end is None:
                return None
            i = end
            continue
        if c in _CLOSERS:
            stack.append(_CLOSERS[c])
        elif stack and c == stack[-1]:
            stack.pop()
        elif not stack and c in stops:
            if not text[start:i].strip():
                raise Invalid(f"a value is missing at {start}")
            return i
        elif c in ")]}":
            raise Invalid(f"unbalanced {c!r} at {i}")
        i += 1
    return None


def string_end(text: str, i: int, python: bool) -> int | None:
    """Index just past the string literal opening at i, or None if it has not ended yet."""
    quote = text[i]
    triple = python and text.startswith(quote * 3, i)
    j = i + (3 if triple else 1)
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if triple:
            if text.startswith(quote * 3, j):
                return j + 3
        elif c == quote:
            return j + 1
        elif c == "\n":
            raise Invalid("a line break inside a one-line string")
        j += 1
    return None


def python_value(source: str) -> Any:
    """A Python literal (str, number, bool, None, list, tuple, dict) as a JSON-able value."""
    try:
        value = ast.literal_eval(ast.parse(source.strip(), mode="eval"))
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as e:
        raise Invalid(f"not a Python literal: {source.strip()[:40]!r}") from e
    _check_jsonable(value)
    return value


def json_value(source: str) -> Any:
    try:
        return json.loads(source)
    except (ValueError, RecursionError) as e:
        raise Invalid(f"not a JSON value: {source.strip()[:40]!r}") from e


def _check_jsonable(value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise Invalid("NaN and infinities have no JSON form")
    if isinstance(value, list | tuple):
        for item in value:
            _check_jsonable(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise Invalid(f"argument objects need string keys, got {key!r}")
            _check_jsonable(item)
    elif not isinstance(value, str | int | float | bool | type(None)):
        raise Invalid(f"{type(value).__name__} values have no JSON form")


def dumps(value: Any) -> str:
    """The JSON text tool-call arguments are sent as (one form for both parsers)."""
    return json.dumps(value, ensure_ascii=False)

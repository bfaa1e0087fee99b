"""A StructuredOutputsParams as llguidance grammar text, and compiling it into a matcher.

llguidance reads one grammar format (its JSON "grammar with lexer" text); JSON schemas, regexes,
Lark and GBNF are translated into it here. Translating never fails on a bad spec; building the
`LLMatcher` does, and that failure is turned into an InvalidGrammarError naming the field.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import llguidance

from inferd.structured.tokenizer_info import TokenizerInfo
from inferd.structured_params import InvalidGrammarError, StructuredOutputsParams

# Keywords whose value maps names to subschemas, and keywords whose value is a subschema or a
# list of them: where `additionalProperties: false` must be pushed down.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMAS = (
    "items", "prefixItems", "additionalItems", "contains", "additionalProperties", "not",
    "if", "then", "else", "allOf", "anyOf", "oneOf", "propertyNames",
)  # fmt: skip


_POSITION = re.compile(r"^at \d+\(\d+\): ")
# Whitespace a JSON reply may put between tokens: nothing, one space (or tab), or one line break
# followed by indentation (pretty-printed JSON). Bounded, because a model that starts emitting
# blanks (sampled, or a small one) would otherwise fill max_tokens with them and never finish.
WHITESPACE = r"(?:[\x20\x09]?|\r?\n[\x20\x09]{0,24})"


def closed_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of `schema` in which every object schema that says nothing about
    `additionalProperties` gets `false` (only the declared keys: OpenAI's strict mode, and
    xgrammar's strict_mode, vLLM's default), and every `prefixItems` without `items` allows no
    further items. Members of an `allOf` stay open themselves (each closed, an instance that
    needs the keys of two members would match neither); what they nest is closed."""
    out = copy.deepcopy(schema)
    _close(out)
    return out


def _close(node: Any, close_self: bool = True) -> None:
    if isinstance(node, list):
        for item in node:
            _close(item, close_self)
        return
    if not isinstance(node, dict):
        return
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            for sub in node[key].values():
                _close(sub)
    for key in _SUBSCHEMAS:
        if isinstance(node.get(key), dict | list):
            _close(node[key], close_self=key != "allOf")
    if not close_self:
        return
    if "additionalProperties" not in node and isinstance(node.get("properties"), dict):
        node["additionalProperties"] = False
    if "items" not in node and isinstance(node.get("prefixItems"), list):
        node["items"] = False


def grammar_text(spec: StructuredOutputsParams) -> str:
    """llguidance's grammar text for `spec` (no validation: see `compile_matcher`)."""
    kind = spec.kind
    if kind in ("json", "json_object"):
        schema: dict[str, Any] = spec.json if kind == "json" else {"type": "object"}
        if spec.closes_objects:
            schema = closed_schema(schema)
        options: dict[str, Any] = {"whitespace_flexible": not spec.disable_any_whitespace}
        if options["whitespace_flexible"]:
            options["whitespace_pattern"] = WHITESPACE
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=options)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec.regex)
    if kind == "choice":
        # A JSON string literal is a valid Lark string literal (same escapes).
        alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.choice)
        return llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}")
    try:
        return llguidance.grammar_from("grammar", spec.grammar)  # Lark, or GBNF converted
    except ValueError as e:
        field = spec.field_name()
        raise InvalidGrammarError(f"{field}: {_one_line(str(e))}", field) from e


def compile_matcher(
    spec: StructuredOutputsParams, info: TokenizerInfo, grammar: str | None = None
) -> llguidance.LLMatcher:
    """A fresh matcher for `spec` (its initial state), or InvalidGrammarError."""
    grammar = grammar_text(spec) if grammar is None else grammar
    matcher = llguidance.LLMatcher(info.ll_tokenizer, grammar, log_level=0)
    if matcher.is_error():
        message = _one_line(matcher.get_error())
        if spec.kind != "grammar":  # positions in the Lark text generated from the spec
            message = _POSITION.sub("", message)
        field = spec.field_name()
        raise InvalidGrammarError(f"{field}: {_describe(spec.kind)}: {message}", field)
    return matcher


def _describe(kind: str) -> str:
    return {
        "json": "invalid or unsupported JSON schema",
        "json_object": "cannot build the JSON grammar",
        "regex": "invalid regular expression",
        "choice": "cannot build the choice grammar",
        "grammar": "invalid grammar",
    }[kind]


def _one_line(message: str) -> str:
    """llguidance's multi-line diagnostics (source excerpts, caret lines) as one line."""
    kept = []
    for line in message.splitlines():
        text = line.strip()
        # Caret markers and numbered excerpts of the generated Lark mean nothing to the user.
        if not text or set(text) <= {"^", "~", " "} or text.split("|")[0].strip().isdigit():
            continue
        kept.append(text)
    return " ".join(kept) or message.strip()

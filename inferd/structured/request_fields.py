"""The request fields that ask for structured output, read into one StructuredOutputsParams.

A request may say it three ways: OpenAI's `response_format` (`json_object`, or `json_schema`
with `strict`), vLLM's `structured_outputs` object, and vLLM's older `guided_json`,
`guided_regex`, `guided_choice`, `guided_grammar` fields. `resolve` takes all of them, refuses
more than one, and returns the spec (None when plain text was asked for). Every bad value is a
InvalidRequest naming its field (HTTP 400).
"""

from __future__ import annotations

from typing import Any

from inferd.errors import InvalidRequest
from inferd.structured_params import StructuredOutputsParams

GUIDED_FIELDS = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


# The keys each response_format type takes: anything else is refused, never ignored.
_FORMAT_KEYS = {"text": {"type"}, "json_object": {"type", "schema"},
                "json_schema": {"type", "json_schema"}}  # fmt: skip
_JSON_SCHEMA_KEYS = {"name", "description", "schema", "strict"}


def _refuse_unknown(value: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise InvalidRequest(
            f"{where}.{unknown[0]}",
            f"unsupported parameter: {where}.{unknown[0]} ({where} takes "
            f"{', '.join(sorted(allowed))})",
        )


def from_response_format(value: Any) -> StructuredOutputsParams | None:
    """OpenAI's `response_format`: {"type": "text" | "json_object" | "json_schema", ...}, and
    llama.cpp's `{"type": "json_object", "schema": {...}}` (a JSON object of that schema)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        message = f"response_format must be an object, got {type(value).__name__}"
        raise InvalidRequest("response_format", message)
    kind = value.get("type")
    if kind not in _FORMAT_KEYS:
        raise InvalidRequest(
            "response_format.type",
            f"response_format.type must be one of text, json_object, json_schema, got {kind!r}",
        )
    _refuse_unknown(value, _FORMAT_KEYS[kind], "response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = value.get("schema")
        if schema is None:
            return StructuredOutputsParams(json_object=True, origin="response_format")
        if not isinstance(schema, dict):
            raise InvalidRequest(
                "response_format.schema",
                f"response_format.schema must be a JSON schema object, got {type(schema).__name__}",
            )
        return StructuredOutputsParams(json=schema, origin="response_format.schema")
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise InvalidRequest(
            "response_format.json_schema.schema",
            "response_format.json_schema.schema must be a JSON schema object",
        )
    _refuse_unknown(spec, _JSON_SCHEMA_KEYS, "response_format.json_schema")
    strict = spec.get("strict", False)
    if not isinstance(strict, bool | None):
        raise InvalidRequest(
            "response_format.json_schema.strict",
            f"response_format.json_schema.strict must be a boolean, got {strict!r}",
        )
    # Strict or not, an object allows only its declared keys where the schema says nothing
    # (OpenAI's strict mode; vLLM's default backend treats non-strict schemas alike):
    # instructor's JSON_SCHEMA mode sends non-strict schemas without additionalProperties, and
    # a small model given the freedom writes invented keys until max_tokens runs out.
    return StructuredOutputsParams(json=spec["schema"], origin="response_format.json_schema.schema")


def from_guided_fields(fields: dict[str, Any]) -> StructuredOutputsParams | None:
    """vLLM's `guided_*` fields (the ones set, not None)."""
    given = {k: v for k, v in fields.items() if k in GUIDED_FIELDS and v is not None}
    if not given:
        return None
    if len(given) > 1:
        message = f"give only one of {', '.join(GUIDED_FIELDS)}; got {', '.join(given)}"
        raise InvalidRequest(next(iter(given)), message)
    ((name, value),) = given.items()
    return StructuredOutputsParams(**{GUIDED_FIELDS[name]: value}, origin=name)


def resolve(
    *,
    response_format: Any = None,
    structured_outputs: Any = None,
    guided: dict[str, Any] | None = None,
) -> StructuredOutputsParams | None:
    """The one structured-output spec a request asks for, or None."""
    specs = {
        "response_format": from_response_format(response_format),
        "structured_outputs": (
            None
            if structured_outputs is None
            else StructuredOutputsParams.from_dict(structured_outputs)
        ),
        "guided_*": from_guided_fields(guided or {}),
    }
    chosen = {name: spec for name, spec in specs.items() if spec is not None}
    if len(chosen) > 1:
        message = f"ask for structured output one way only; got {', '.join(chosen)}"
        raise InvalidRequest(next(iter(chosen)), message)
    return next(iter(chosen.values()), None)

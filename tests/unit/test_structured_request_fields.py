"""The request fields asking for structured output (response_format, structured_outputs,
guided_*) read into one spec; bad values and conflicts are ValueErrors naming the field, and a
compile error names the field the request used."""

from __future__ import annotations

import re

import pytest
from structured_vocab import small_info

from inferd.structured import InvalidGrammarError, StructuredOutputsParams
from inferd.structured.manager import GrammarManager
from inferd.structured.request_fields import resolve

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def test_each_way_of_asking():
    assert resolve() is None
    assert resolve(response_format={"type": "text"}) is None
    assert resolve(response_format={"type": "json_object"}).json_object is True
    strict = resolve(
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": SCHEMA, "strict": True},
        }
    )
    assert strict.json == SCHEMA and strict.closes_objects
    # Not strict: still only the declared keys (vLLM's default backend, xgrammar's strict_mode).
    loose = resolve(response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}})
    assert loose.closes_objects
    opened = resolve(structured_outputs={"json": SCHEMA, "disable_additional_properties": False})
    assert not opened.closes_objects
    assert resolve(structured_outputs={"regex": "a+"}) == StructuredOutputsParams(regex="a+")
    assert resolve(guided={"guided_choice": ["x", "y"], "guided_json": None}).choice == ["x", "y"]
    assert resolve(guided={"guided_grammar": 'start: "a"'}).grammar == 'start: "a"'


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        (
            {"response_format": {"type": "sound"}},
            "response_format.type must be one of text, json_object, json_schema, got 'sound'",
        ),
        ({"response_format": "json"}, "response_format must be an object"),
        (
            {"response_format": {"type": "json_schema"}},
            "response_format.json_schema.schema must be a JSON schema object",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": SCHEMA, "strict": "yes"},
                }
            },
            "response_format.json_schema.strict must be a boolean",
        ),
        ({"guided": {"guided_regex": ""}}, "guided_regex must be a non-empty string"),
        ({"guided": {"guided_choice": "a"}}, "guided_choice must be a non-empty list of strings"),
        ({"guided": {"guided_regex": "a", "guided_choice": ["a"]}}, "give only one of guided_json"),
        (
            {"response_format": {"type": "json_object"}, "guided": {"guided_regex": "a"}},
            "ask for structured output one way only; got response_format, guided_*",
        ),
        (
            {"structured_outputs": {"regex": "a", "bogus": 1}},
            "unsupported parameter: structured_outputs.bogus",
        ),
        (
            {"structured_outputs": {"regex": "a", "origin": "x"}},
            "unsupported parameter: structured_outputs.origin",
        ),
    ],
)
def test_bad_fields_name_themselves(fields, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        resolve(**fields)


def test_compile_errors_name_the_field_used():
    with GrammarManager(small_info()) as manager:
        for fields, name in [
            ({"guided": {"guided_regex": "a(b"}}, "guided_regex: invalid regular expression"),
            ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs.regex: invalid regular"),
            (
                {
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"schema": {"type": "objekt"}},
                    }
                },
                "response_format.json_schema.schema: invalid or unsupported JSON schema",
            ),
        ]:
            with pytest.raises(InvalidGrammarError, match=re.escape(name)):
                manager.compile(resolve(**fields))


def test_a_closed_schema_allows_only_declared_keys_and_items():
    """What a schema leaves unsaid is closed (xgrammar's strict_mode, vLLM's default); what it
    says stays; members of an allOf stay open themselves (closed, they could not be combined)."""
    from inferd.structured.grammar import closed_schema

    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "integer"}}},
            "free": {"type": "object", "properties": {}, "additionalProperties": True},
            "pair": {"type": "array", "prefixItems": [{"type": "integer"}]},
            "both": {"allOf": [{"properties": {"x": {}}}, {"properties": {"y": {}}}]},
        },
    }
    closed = closed_schema(schema)
    assert closed["additionalProperties"] is False
    props = closed["properties"]
    assert props["a"]["additionalProperties"] is False
    assert props["free"]["additionalProperties"] is True
    assert props["pair"]["items"] is False
    assert all("additionalProperties" not in m for m in props["both"]["allOf"])
    assert "additionalProperties" not in schema  # a copy

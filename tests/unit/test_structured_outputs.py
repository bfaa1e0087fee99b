"""Structured outputs on a small vocabulary: every reply a random "model" samples under the mask
matches the spec (regex, choice, JSON schema, Lark and GBNF grammars), bad specs fail with the
field named, and the manager compiles off-thread, once per spec."""

from __future__ import annotations

import json
import re
import threading

import pytest
from structured_vocab import EOS, EOT, constrained_run, decode, small_info

from inferd.sampling_params import SamplingParams
from inferd.structured import InvalidGrammarError, StructuredOutputsParams
from inferd.structured.manager import GrammarManager

RUNS = 40


@pytest.fixture(scope="module")
def manager():
    with GrammarManager(small_info()) as m:
        yield m


def sample_texts(
    manager: GrammarManager, spec: StructuredOutputsParams, bounded: bool = True
) -> list[str]:
    """The replies of RUNS seeded runs. A `bounded` language ends within the token limit; for
    an unbounded one, only the runs that ended are returned."""
    texts = []
    for seed in range(RUNS):
        ids = constrained_run(manager.compile(spec), manager.info, seed)
        ended = ids[-1] in (EOS, EOT)
        assert ended or not bounded, f"run {seed} did not end: {decode(ids)!r}"
        if ended:
            texts.append(decode(ids))
    return texts


def test_regex_replies_always_match(manager):
    pattern = r"[a-c]{2,5}-[0-9]{1,3}( ok)?"
    texts = sample_texts(manager, StructuredOutputsParams(regex=pattern))
    assert all(re.fullmatch(pattern, t) for t in texts), texts
    assert len(set(texts)) > RUNS // 2  # the runs explored the language, not one string


def test_choice_replies_are_choices(manager):
    choices = ["yes", "no", "maybe not", 'say "hi"\n', "é"]
    texts = sample_texts(manager, StructuredOutputsParams(choice=choices))
    assert set(texts) <= set(choices)
    assert len(set(texts)) >= 3


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 5},
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": -5, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["a", "b", 3]}, "maxItems": 3},
        "note": {"type": ["string", "null"], "pattern": "^[xy]*$", "maxLength": 3},
    },
    "required": ["name", "ok", "n"],
    "additionalProperties": False,
}


def check_schema_instance(value: object) -> None:
    assert isinstance(value, dict) and set(value) <= set(SCHEMA["properties"])
    assert {"name", "ok", "n"} <= set(value)
    assert isinstance(value["name"], str) and len(value["name"]) <= 5
    assert isinstance(value["ok"], bool)
    assert type(value["n"]) is int and -5 <= value["n"] <= 99
    tags = value.get("tags", [])
    assert isinstance(tags, list) and len(tags) <= 3 and all(t in ("a", "b", 3) for t in tags)
    note = value.get("note")
    assert note is None or re.fullmatch(r"[xy]{0,3}", note)


def outside_strings(text: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"', "", text)


@pytest.mark.parametrize("compact", [True, False])
def test_json_schema_replies_validate(manager, compact):
    spec = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=compact)
    texts = sample_texts(manager, spec)
    for text in texts:
        check_schema_instance(json.loads(text))
    assert len({json.dumps(json.loads(t), sort_keys=True) for t in texts}) > RUNS // 2
    # Random logits put whitespace between tokens in some run, unless it is disabled.
    spaced = [t for t in texts if re.search(r"\s", outside_strings(t))]
    assert not spaced if compact else spaced


def test_json_object_and_closed_schema(manager):
    texts = sample_texts(manager, StructuredOutputsParams(json_object=True), bounded=False)
    assert len(texts) >= RUNS // 4
    assert all(isinstance(json.loads(t), dict) for t in texts)
    open_schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}
    # Closed by default (vLLM's default backend): no key beyond "a", without being asked.
    spec = StructuredOutputsParams(json=open_schema, disable_any_whitespace=True)
    assert {t for t in sample_texts(manager, spec)} <= {'{"a":true}', '{"a":false}'}


@pytest.mark.parametrize(
    "grammar",
    [
        'start: "(" num (op num)* ")"\nnum: /[0-9]{1,2}/\nop: "+" | "*"',
        'root ::= "(" num (op num)* ")"\nnum ::= [0-9] [0-9]?\nop ::= "+" | "*"',  # GBNF
    ],
)
def test_grammar_replies_parse(manager, grammar):
    texts = sample_texts(manager, StructuredOutputsParams(grammar=grammar))
    assert all(re.fullmatch(r"\([0-9]{1,2}([+*][0-9]{1,2})*\)", t) for t in texts), texts


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ({"regex": "a(b"}, "structured_outputs.regex: invalid regular expression: invalid regex"),
        ({"json": {"type": "objekt"}}, "structured_outputs.json: invalid or unsupported"),
        ({"json": {"type": "string", "pattern": "(("}}, "structured_outputs.json"),
        ({"grammar": "start: foo"}, "structured_outputs.grammar: invalid grammar: at 1(8)"),
    ],
)
def test_invalid_specs_fail_compilation_naming_the_field(manager, spec, needle):
    with pytest.raises(InvalidGrammarError, match=re.escape(needle)) as err:
        manager.compile(StructuredOutputsParams(**spec))
    assert "\n" not in str(err.value)
    assert isinstance(err.value, ValueError)  # the server's 400


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({}, "exactly one of json, regex, choice, grammar, json_object; got none"),
        ({"regex": "a", "choice": ["a"]}, "got regex, choice"),
        ({"json": "{not json"}, "structured_outputs.json is not valid JSON"),
        ({"json": 3}, "structured_outputs.json must be a JSON schema object"),
        ({"json": "[1]"}, "structured_outputs.json must be a JSON schema object"),
        ({"regex": ""}, "structured_outputs.regex must be a non-empty string"),
        ({"grammar": 5}, "structured_outputs.grammar must be a non-empty string"),
        ({"choice": []}, "structured_outputs.choice must be a non-empty list"),
        ({"choice": "yes"}, "structured_outputs.choice must be a non-empty list"),
        ({"choice": ["a", 1]}, "structured_outputs.choice entries must be non-empty strings"),
        ({"json_object": "yes"}, "structured_outputs.json_object must be a boolean"),
        ({"regex": "a", "disable_any_whitespace": 1}, "disable_any_whitespace must be a boolean"),
    ],
)
def test_bad_specs_are_value_errors_naming_the_field(fields, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        StructuredOutputsParams(**fields)


def test_sampling_params_field():
    params = SamplingParams(structured_outputs={"choice": ["a", "b"]})
    assert params.structured_outputs == StructuredOutputsParams(choice=["a", "b"])
    assert params.clone().structured_outputs.kind == "choice"
    assert SamplingParams().structured_outputs is None
    with pytest.raises(ValueError, match="unsupported parameter: structured_outputs.whitespace"):
        SamplingParams(structured_outputs={"regex": "a", "whitespace": " "})
    with pytest.raises(ValueError, match="structured_outputs must be a StructuredOutputsParams"):
        SamplingParams(structured_outputs="a|b")
    spec = StructuredOutputsParams(json='{"type": "object", "required": ["a"]}')
    assert spec.json == {"type": "object", "required": ["a"]}  # parsed once, one canonical form
    same = StructuredOutputsParams(json={"required": ["a"], "type": "object"})
    assert spec.key == same.key
    assert spec.key != StructuredOutputsParams(json=spec.json, disable_any_whitespace=True).key


def test_manager_compiles_once_per_spec_and_isolates_failures():
    built = []

    def build():
        built.append(threading.current_thread().name)
        return small_info()

    with GrammarManager(build) as manager:
        assert built == []  # lazily: nothing until the first spec
        good = manager.submit(StructuredOutputsParams(regex="ab+"))
        bad = manager.submit(StructuredOutputsParams(regex="a(b"))
        assert manager.submit(StructuredOutputsParams(regex="ab+")) is good
        first, second = manager.matcher(good), manager.matcher(good)
        with pytest.raises(InvalidGrammarError):
            manager.matcher(bad)
        assert manager.is_ready(good) and manager.is_ready(bad)
        assert len(built) == 1 and built[0].startswith("inferd-grammar")
        # Each sequence gets its own state.
        assert first.accept_tokens(list(b"abbb"))
        assert second.allows(ord("a")) and not first.allows(ord("a"))

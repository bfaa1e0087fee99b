"""tool_choice "required" or a named function, as a grammar the reply must follow.

With `auto` the model may answer in text or call tools, and the parser finds the calls. With
`required` (one or more calls) or `{"type": "function", "function": {"name": ...}}` (exactly that
call) the reply is constrained, in the model's own call format, so it is always a well-formed
call whose arguments validate against the function's JSON schema:

- hermes: `<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>`, the object given to
  llguidance as a JSON schema (name a constant, arguments the function's parameters).
- pythonic: `[f(a=1, b="x")]`, a Lark grammar whose argument values are Python literals built
  from the parameter schemas (python_literals.py).

In both, objects accept only their declared keys (OpenAI's strict mode), keys in schema order,
with the separators the bundled templates show the model (", " and ": ").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from inferd.errors import InvalidRequest
from inferd.structured.grammar import closed_schema
from inferd.structured_params import StructuredOutputsParams
from inferd.tools.python_literals import PythonLiteralRules

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Function:
    name: str
    parameters: dict[str, Any]  # a JSON schema of an object


def parse_tools(tools: Any) -> list[Function]:
    """OpenAI's `tools` list (function tools); InvalidRequest naming the bad entry. An empty
    list is no tools: OpenAI and vLLM read it so, and the OpenAI Agents SDK sends one for an
    agent without tools."""
    if not isinstance(tools, list):
        raise InvalidRequest("tools", "tools must be a list of function tools")
    functions: list[Function] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            message = f'tools[{i}].type: only "function" tools are supported'
            raise InvalidRequest(f"tools[{i}].type", message)
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            message = f"tools[{i}].function must be an object with a name"
            raise InvalidRequest(f"tools[{i}].function", message)
        name = function["name"]
        if not _NAME.match(name):
            message = f"tools[{i}].function.name must match [A-Za-z0-9_-]{{1,64}}"
            raise InvalidRequest(f"tools[{i}].function.name", message)
        if any(f.name == name for f in functions):
            message = f"tools[{i}].function.name {name!r} is not unique"
            raise InvalidRequest(f"tools[{i}].function.name", message)
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
            where = f"tools[{i}].function.parameters"
            raise InvalidRequest(where, f"{where} must be a JSON schema of an object")
        functions.append(Function(name, parameters))
    return functions


def forced_function(tool_choice: Any, functions: list[Function]) -> str | None:
    """None for "none"/"auto" (nothing forced), "" for "required", else the named function."""
    if tool_choice in (None, "none", "auto"):
        return None
    if tool_choice == "required":
        if not functions:  # nothing could be called: no grammar to force
            message = "tool_choice 'required' needs at least one tool, and tools is empty"
            raise InvalidRequest("tool_choice", message)
        return ""
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        if any(f.name == name for f in functions):
            return name
        message = f"tool_choice names function {name!r}, which is not in tools"
        raise InvalidRequest("tool_choice", message)
    raise InvalidRequest(
        "tool_choice",
        'tool_choice must be "none", "auto", "required" or '
        '{"type": "function", "function": {"name": ...}}',
    )


def tool_call_spec(
    tools: Any, tool_choice: Any, parser: str, parallel: bool = True
) -> StructuredOutputsParams | None:
    """The structured-output spec forcing `tool_choice` in `parser`'s format, or None when
    nothing is forced. "required" allows several calls unless `parallel` is False
    (`parallel_tool_calls`); a named function is called once. A spec that cannot be written
    is an InvalidRequest naming `tools` (compile errors name it too: the spec's origin)."""
    functions = parse_tools(tools)
    forced = forced_function(tool_choice, functions)
    if forced is None:
        return None
    chosen = functions if forced == "" else [f for f in functions if f.name == forced]
    many = forced == "" and parallel
    try:
        if parser == "hermes":
            grammar = hermes_grammar(chosen, many)
        elif parser == "pythonic":
            grammar = pythonic_grammar(chosen, many)
        else:
            raise ValueError(f"no tool-call grammar for parser {parser!r}")
    except InvalidRequest:
        raise
    except ValueError as e:
        raise InvalidRequest("tools", f"tools: {e}") from e
    return StructuredOutputsParams(grammar=grammar, origin="tools")


def hermes_grammar(functions: list[Function], many: bool) -> str:
    more = ' ("\\n" call)*' if many else ""
    lines = [f"start: call{more}"]
    lines.append("call: " + " | ".join(f"call{i}" for i in range(len(functions))))
    for i, f in enumerate(functions):
        schema = {
            "type": "object",
            "properties": {"name": {"const": f.name}, "arguments": closed_schema(f.parameters)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
            "x-guidance": _COMPACT,
        }
        lines.append(f'call{i}: "<tool_call>\\n" %json {json.dumps(schema)} "\\n</tool_call>"')
    return "\n".join(lines)


def pythonic_grammar(functions: list[Function], many: bool) -> str:
    for f in functions:
        if not f.name.isidentifier():
            raise ValueError(f"function name {f.name!r} cannot be written as a Python call")
    rules = PythonLiteralRules()
    calls = []
    for f in functions:
        where = f"function {f.name!r}"
        arguments = rules.members(closed_schema(f.parameters), where, keyword=True)
        calls.append(rules.add(f'{json.dumps(f.name + "(")} {arguments} ")"'))
    call = rules.add(" | ".join(calls))
    start = f'"[" {call} (", " {call})* "]"' if many else f'"[" {call} "]"'
    return "\n".join([f"start: {start}", *rules.lines])

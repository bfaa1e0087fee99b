"""Tool calling: reading calls out of a model's reply, and constraining replies to calls.

    types.py      ToolCall / ToolCallDelta / StreamDelta (OpenAI's shapes)
    parser.py     the ToolParser interface and the stream-delta machinery
    pythonic.py   `[f(x=1), g(y="a")]` (Gemma 3, as Google documents it)
    hermes.py     `<tool_call>{"name": ..., "arguments": ...}</tool_call>` (ChatML models)
    harmony.py    gpt-oss's channels: reasoning, answer and `to=functions.NAME` calls
    constrain.py  tool_choice "required" / a named function as a structured-output grammar
    templates.py  the bundled chat templates that present tools, and message preparation

Parsers are chosen by name, as vLLM's `--tool-call-parser NAME` (`openai` is vLLM's name for
harmony).
"""

from __future__ import annotations

from inferd.tools.harmony import HarmonyToolParser
from inferd.tools.hermes import HermesToolParser
from inferd.tools.parser import ToolCallStream, ToolParser
from inferd.tools.pythonic import PythonicToolParser
from inferd.tools.types import ParsedReply, StreamDelta, ToolCall, ToolCallDelta

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    PythonicToolParser.name: PythonicToolParser,
    HermesToolParser.name: HermesToolParser,
    HarmonyToolParser.name: HarmonyToolParser,
    "openai": HarmonyToolParser,
}


def get_tool_parser(name: str) -> ToolParser:
    """The parser `--tool-call-parser NAME` selects; ValueError naming the choices."""
    parser = TOOL_PARSERS.get(name)
    if parser is None:
        choices = ", ".join(sorted(TOOL_PARSERS))
        raise ValueError(f"--tool-call-parser: unknown parser {name!r} (choose from {choices})")
    return parser()


__all__ = [
    "TOOL_PARSERS",
    "ParsedReply",
    "StreamDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallStream",
    "ToolParser",
    "get_tool_parser",
]

"""Tool calling on /v1/chat/completions, with vLLM's semantics:

- `tool_choice: "auto"` (the default when `tools` are given) needs the server started with
  `--enable-auto-tool-choice --tool-call-parser NAME`: the model answers in text or calls tools,
  and the parser finds the calls in its reply. Without those flags it is a 400.
- `"required"` and a named function work on any server: the reply is constrained by a grammar
  (structured outputs) to well-formed calls, in the configured parser's format, else in the
  model family's own (`ToolSettings.forced_format`), and read back by that format's parser.
- `"none"`: the tools are not shown to the model and nothing is parsed (inferd leaves them out of
  the prompt: a model shown tools it may not call tends to call them anyway).

The tools reach the chat template as its `tools` variable; when the model's own template does
not show tools, the server renders tool requests with the parser's bundled template
(`ToolSettings.template`, chosen at start-up by `inferd serve`).

finish_reason is "tool_calls" when an `auto` or `required` reply that called tools ended
normally, and "stop" for a named function, as OpenAI answers.

Harmony models (gpt-oss, `ToolSettings.harmony`) answer in channels: every reply is read by the
harmony parser, with or without tools, into reasoning (`reasoning_content`), content and calls;
calls count only where the request offered tools with tool_choice "auto" (else they stay
content). Forced calls have no grammar in harmony: "required" and a named function are a 400.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inferd.errors import InvalidRequest
from inferd.server.openai.protocol import ChatCompletionRequest
from inferd.structured_params import StructuredOutputsParams
from inferd.tools import ParsedReply, StreamDelta, ToolCallStream, ToolParser, get_tool_parser
from inferd.tools.constrain import parse_tools, tool_call_spec
from inferd.tools.harmony import HarmonyToolParser


@dataclass(frozen=True)
class ToolSettings:
    parser: str | None = None  # --tool-call-parser
    enable_auto: bool = False  # --enable-auto-tool-choice
    forced_format: str = "hermes"  # the call format of required / named calls
    template: Any = None  # a template object that shows tools, or None: the model's own
    harmony: bool = False  # the model answers in harmony channels (gpt-oss)


@dataclass
class ToolPlan:
    """What one chat request does with tools."""

    parser: ToolParser | None = None  # None: no tools; with `spec`: a forced call
    spec: StructuredOutputsParams | None = None  # the grammar of a forced call
    tools: list[dict[str, Any]] | None = None  # shown to the template
    named: bool = False
    parallel: bool = True

    @property
    def special_tokens(self) -> bool:
        """Whether replies are decoded with their special tokens (the parser reads channels)."""
        return self.parser is not None and self.parser.channels

    def reply(self, text: str) -> ParsedReply:
        """A whole reply's content, calls and reasoning; the text itself as content when it
        called no tools (unless the parser reads channels: then never the raw text)."""
        if self.parser is None:
            return ParsedReply(text, [])
        parsed = self.parser.parse(text)
        if not self.parallel:
            parsed.calls = parsed.calls[:1]
        return parsed if parsed.calls or self.parser.channels else ParsedReply(text, [])

    def message(self, role: str, text: str) -> tuple[dict[str, Any], bool]:
        """The reply's chat message, and whether it called tools. Reasoning is vLLM's
        `reasoning_content` (the field its reasoning parsers fill)."""
        parsed = self.reply(text)
        message: dict[str, Any] = {"role": role, "content": parsed.content}
        if parsed.reasoning:
            message["reasoning_content"] = parsed.reasoning
        if parsed.calls:
            message["content"] = parsed.content or None
            message["tool_calls"] = [c.to_openai() for c in parsed.calls]
        return message, bool(parsed.calls)

    def finish_reason(self, finish_reason: str | None, called: bool) -> str | None:
        if called and finish_reason == "stop" and not self.named:
            return "tool_calls"
        return finish_reason

    def stream(self) -> ChoiceStream:
        return ChoiceStream(self)


@dataclass
class ChoiceStream:
    """One streamed choice: text deltas in, `delta` fields out (content and tool_calls)."""

    plan: ToolPlan
    called: bool = False
    _calls: ToolCallStream | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.plan.parser is not None:
            self._calls = self.plan.parser.stream()

    def take(self, text: str, final: bool) -> StreamDelta:
        """What a text delta adds: content to send now and tool-call fragments."""
        if self._calls is None:
            return StreamDelta(text)
        out = self._calls.feed(text)
        if final:
            rest = self._calls.finish()
            out.content += rest.content
            out.tool_calls += rest.tool_calls
            out.reasoning += rest.reasoning
        out.tool_calls = [c for c in out.tool_calls if self.plan.parallel or c.index == 0]
        self.called = self.called or bool(out.tool_calls)
        return out

    def feed(self, text: str, final: bool) -> dict[str, Any]:
        """The chat chunk's `delta` fields (reasoning_content, content, tool_calls) for a text
        delta."""
        out = self.take(text, final)
        delta: dict[str, Any] = {}
        if out.reasoning:
            delta["reasoning_content"] = out.reasoning
        if out.content:
            delta["content"] = out.content
        if out.tool_calls:
            delta["tool_calls"] = [c.to_openai() for c in out.tool_calls]
        return delta


def checked_tools(tools: list[dict[str, Any]], schema_field: str) -> list[dict[str, Any]]:
    """`tools` translated into the chat's shape from an API whose tools are flat (the Responses
    API: name, parameters; Anthropic's: name, input_schema), checked, with errors naming that
    API's fields."""
    try:
        parse_tools(tools)
    except InvalidRequest as e:
        param = (e.param or "").replace(".function.parameters", f".{schema_field}")
        param = param.replace(".function", "")
        raise InvalidRequest(param, e.message.replace(e.param or "", param)) from e
    return tools


def plan_tools(body: ChatCompletionRequest, settings: ToolSettings) -> ToolPlan:
    """Check `tools` / `tool_choice` against the server's settings (400 naming the field)."""
    if settings.harmony:
        return _harmony_plan(body, settings)
    return _plan(body, settings)


def _harmony_plan(body: ChatCompletionRequest, settings: ToolSettings) -> ToolPlan:
    if body.tools and body.tool_choice not in (None, "auto", "none"):
        parse_tools(body.tools)  # a malformed list is named first
        raise InvalidRequest(
            "tool_choice",
            'tool_choice "required" and named functions are not supported for models that '
            'answer in the harmony format (gpt-oss); use "auto" or "none"',
        )
    plan = _plan(body, settings)
    plan.parser = HarmonyToolParser(calls=plan.parser is not None)
    return plan


def _plan(body: ChatCompletionRequest, settings: ToolSettings) -> ToolPlan:
    choice = body.tool_choice
    if body.tools is None:
        if choice not in (None, "none"):
            raise InvalidRequest("tool_choice", "tool_choice needs tools")
        return ToolPlan()
    parse_tools(body.tools)  # a malformed list is a 400 even when it will not be used
    if not body.tools:
        # NOTE: `tools: []` is no tools (parse_tools); "auto" then has nothing to choose from
        # and means "none" (vLLM's reading), but a call that must be made has no tool to call.
        if choice not in (None, "none", "auto"):
            raise InvalidRequest(
                "tool_choice",
                f"tool_choice {choice!r} needs at least one tool, and tools is empty",
            )
        return ToolPlan()
    choice = "auto" if choice is None else choice
    if choice == "none":
        return ToolPlan()
    if choice == "auto":
        if not (settings.enable_auto and settings.parser):
            raise InvalidRequest(
                "tool_choice",
                'tool_choice "auto" needs a server started with --enable-auto-tool-choice and '
                '--tool-call-parser; "required" or a named function work without them',
            )
        parser = get_tool_parser(settings.parser)
        return ToolPlan(parser, None, body.tools, parallel=body.parallel_tool_calls)
    spec = tool_call_spec(body.tools, choice, settings.forced_format, body.parallel_tool_calls)
    return ToolPlan(get_tool_parser(settings.forced_format), spec, body.tools,
                    named=isinstance(choice, dict), parallel=body.parallel_tool_calls)  # fmt: skip

"""`inferd serve` flags for tool calling, CORS and request limits (vLLM's names), and the
settings they become.

Tool calling: `--enable-auto-tool-choice --tool-call-parser NAME` as in vLLM (both needed for
`tool_choice: "auto"`). Requests that carry tools are rendered with the model's own chat template
when it shows tools, else with the bundled template of the call format in use; `required` and a
named function use that format too, which is the parser's, or without one the model family's
(its Architecture record's `tool_call_format`, inferd/models/): pythonic for Gemma (Google's
documented format), hermes for ChatML models. Harmony models (gpt-oss) have every reply read
by the harmony parser (reasoning, answer, calls: inferd/tools/harmony.py); their own template
shows tools, and no other parser can read their replies.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import TYPE_CHECKING

from inferd.tools import TOOL_PARSERS

if TYPE_CHECKING:
    from inferd.server.http.cors import CORSSettings
    from inferd.server.openai.tool_calls import ToolSettings

log = logging.getLogger("inferd.serve")


def _list_arg(text: str) -> list[str]:
    from inferd.server.http.cors import parse_list  # local: `inferd --help` stays light

    try:
        return parse_list(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_feature_arguments(parser: argparse.ArgumentParser) -> None:
    tools = parser.add_argument_group("tool calling")
    tools.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='let requests use tool_choice "auto" (needs --tool-call-parser)',
    )
    tools.add_argument(
        "--tool-call-parser",
        choices=sorted(TOOL_PARSERS),
        default=None,
        help="how tool calls are read from replies: pythonic (Gemma 3, "
        "[f(x=1)]), hermes (ChatML models, <tool_call>{json}</tool_call>) or harmony "
        "(gpt-oss; vLLM's name: openai) "
        "(default: none; forced calls use the model family's format)",
    )
    cors = parser.add_argument_group("CORS (browsers)")
    cors.add_argument(
        "--allowed-origins",
        type=_list_arg,
        default=[],
        help="origins allowed to call the API from a browser, as a JSON list or "
        'comma-separated, e.g. \'["http://localhost:3000"]\' or "*" '
        "(default: none)",
    )
    cors.add_argument(
        "--allowed-methods",
        type=_list_arg,
        default=["*"],
        help="HTTP methods allowed cross-origin (default: all)",
    )
    cors.add_argument(
        "--allowed-headers",
        type=_list_arg,
        default=["*"],
        help="request headers allowed cross-origin (default: all)",
    )
    cors.add_argument(
        "--allow-credentials",
        action="store_true",
        help="allow cookies / credentials cross-origin (needs explicit origins)",
    )
    limits = parser.add_argument_group("request limits (larger is a 400)")
    limits.add_argument(
        "--max-logprobs",
        type=_positive_int,
        default=20,
        help="largest logprobs / top_logprobs / prompt_logprobs (default 20)",
    )
    limits.add_argument(
        "--max-n",
        type=_positive_int,
        default=128,
        help="largest n, samples per prompt (default 128)",
    )
    limits.add_argument(
        "--max-stop-strings",
        type=_positive_int,
        default=16,
        help="most stop strings in one request (default 16)",
    )
    limits.add_argument("--max-stop-string-length", type=_positive_int, default=512,
                        help="longest stop string, in characters (default 512)")  # fmt: skip
    limits.add_argument("--limit-mm-per-prompt", type=_positive_int, default=4,
                        help="most images in one prompt, for vision-language models "
                        "(default 4)")  # fmt: skip


def with_request_limits(config, args: argparse.Namespace):
    """The EngineConfig with the request-limit flags (the engine checks every request)."""
    return dataclasses.replace(
        config,
        max_logprobs=args.max_logprobs,
        max_n=args.max_n,
        max_stop_strings=args.max_stop_strings,
        max_stop_string_length=args.max_stop_string_length,
        limit_mm_per_prompt=args.limit_mm_per_prompt,
    )


def check_tool_flags(args: argparse.Namespace) -> None:
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise ValueError(
            "--enable-auto-tool-choice needs --tool-call-parser (pythonic, hermes or harmony)"
        )


def tool_settings(engine, args: argparse.Namespace) -> ToolSettings:
    """Which call format forced calls use, and which template shows the tools."""
    from inferd.loader import architecture
    from inferd.server.openai.tool_calls import ToolSettings
    from inferd.tokenizer.chat_template import ChatTemplate
    from inferd.tools.templates import template_handles_tools, tool_chat_template

    own = engine.tokenizer.chat_template
    chatml = bool(own) and "<|im_start|>" in own
    family = architecture(engine.model_config.architecture).tool_call_format
    fmt = args.tool_call_parser or family
    fmt = TOOL_PARSERS[fmt].name if fmt in TOOL_PARSERS else fmt  # "openai" is harmony
    harmony = fmt == "harmony"
    if family == "harmony" and not harmony:
        raise ValueError(
            f"--tool-call-parser {args.tool_call_parser}: this model answers in the harmony "
            "format (gpt-oss); use --tool-call-parser harmony (or openai), or leave it out"
        )
    template = None
    if template_handles_tools(own):
        log.info("tool calls: the model's chat template shows tools")
    elif harmony:
        log.warning("tool calls: the model's chat template does not show tools (harmony)")
    elif args.tool_call_parser or fmt == "pythonic" or chatml:
        template = ChatTemplate(tool_chat_template(fmt))
        log.info("tool calls: requests with tools use inferd's bundled %s template", fmt)
    else:
        log.warning(
            "tool calls: the model's chat template does not show tools, and no bundled "
            "template matches its turns; pass --tool-call-parser to choose one"
        )
    return ToolSettings(args.tool_call_parser, args.enable_auto_tool_choice, fmt, template,
                        harmony=harmony)  # fmt: skip


def cors_settings(args: argparse.Namespace) -> CORSSettings:
    from inferd.server.http.cors import CORSSettings

    if args.allow_credentials and "*" in args.allowed_origins:
        raise ValueError("--allow-credentials needs explicit --allowed-origins, not '*'")
    return CORSSettings(args.allowed_origins, args.allowed_methods, args.allowed_headers,
                        args.allow_credentials)  # fmt: skip

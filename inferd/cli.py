"""`inferd` command line: one subcommand per module in `inferd/commands/`.

Only the chosen subcommand's module is imported, so `inferd --help` and light commands start
fast. Errors a user can cause (bad paths, bad flags, bad parameters, damaged model files) print
one line and exit 2 (`--log-level debug` adds the traceback); stdout carries nothing but the
command's own output.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback

from inferd.commands.startup_gc import HOLDING_COMMANDS, holding_collector
from inferd.version import __version__

# name → help; each module inferd.commands.<name> ("-" written "_") has add_arguments(parser)
# and run(args) -> int
COMMANDS = {
    "generate": "Generate a continuation of a prompt",
    "chat": "Chat with a model in the terminal",
    "serve": "Run the OpenAI-compatible HTTP server",
    "memory": "Estimate (or measure) what a model costs in memory",
    "plan": "Plan capacity: speed, concurrency at SLOs, parallelism, power, cost; --check it",
    "bench": "Benchmark throughput, latency and start-up",
    "doctor": "Print what a bug report needs: CPU features, compiler, kernels, torch, threads",
    "pull": "Fetch a model by name into the cache (e.g. smollm2-135m-instruct, a chat model)",
    "models": "List the models known by name, what is cached, and the defaults",
    "cache": "Show what is cached (models, converted weights, tokenizers, kernels); remove it",
    "export-tokenizer": "Write the model's tokenizer as an HF tokenizer folder (AutoTokenizer)",
}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default, unless the help text already says it (options
    whose default is 'decided at start-up' word it themselves). Descriptions keep their lines."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or any(action.default is v for v in (None, False, argparse.SUPPRESS)):
            return text
        return super()._get_help_string(action)


def _finish_parsers(parser: argparse.ArgumentParser) -> None:
    """Give every (sub)command the help formatter and a --quiet flag, down to `bench MODE`."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for action in subs:
        for sub in set(action.choices.values()):
            _finish_parsers(sub)
    parser.formatter_class = HelpFormatter
    if not subs and parser.prog != "inferd":
        options = {s for a in parser._actions for s in a.option_strings}
        if "--quiet" not in options:
            parser.add_argument("--quiet", "-q", action="store_true",
                                help="no status lines or progress bars on stderr")  # fmt: skip


def build_parser(command: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inferd", description="LLM inference engine and server", formatter_class=HelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"inferd {__version__}")
    parser.add_argument(
        "--log-level",
        default="WARNING",
        type=str.upper,
        choices=LOG_LEVELS,
        help="logging level (stderr); DEBUG also prints the traceback of an error",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            module = importlib.import_module(f"inferd.commands.{name.replace('-', '_')}")
            module.add_arguments(p)
            p.set_defaults(_module=module)
            _finish_parsers(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    # NOTE: the collector is held only when this is the process's own start (no argv given):
    # a program or test calling main(argv) keeps its collector as it was.
    process_start = argv is None
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if a in COMMANDS), None)
    if process_start and command in HOLDING_COMMANDS:
        with holding_collector():  # until the command's engine is built (commands/startup_gc.py)
            return _run(argv, command)
    return _run(argv, command)


def _run(argv: list[str], command: str | None) -> int:
    args = build_parser(command).parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(levelname)s %(name)s: %(message)s",
    )
    from inferd.progress import set_quiet

    set_quiet(bool(getattr(args, "quiet", False)))
    try:
        return int(args._module.run(args) or 0)
    except ValueError as e:  # includes ModelLoadError: the user's input, not a bug
        if args.log_level == "DEBUG":
            traceback.print_exc()
        print(f"inferd {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `inferd ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())

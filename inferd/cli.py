"""`inferd` command line: one subcommand per module in `inferd/commands/`.

Errors a user can cause (bad paths, bad flags, bad parameters) print one line and exit 2;
nothing else is printed to stdout but the command's own output.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from inferd import __version__

# name → module in inferd.commands; each has add_arguments(parser) and run(args) -> int
COMMANDS = {
    "generate": "Generate a continuation of a prompt",
    "chat": "Chat with a model in the terminal",
    "memory": "Estimate (or measure) what a model costs in memory",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inferd", description="LLM inference engine and server")
    parser.add_argument("--version", action="version", version=f"inferd {__version__}")
    parser.add_argument("--log-level", default="WARNING", help="logging level (stderr)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text in COMMANDS.items():
        module = importlib.import_module(f"inferd.commands.{name}")
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args._module.run(args) or 0)
    except ValueError as e:  # includes ModelLoadError: the user's input, not a bug
        print(f"inferd {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

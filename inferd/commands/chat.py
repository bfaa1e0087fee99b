"""`inferd chat`: a terminal conversation. Each line you type is a user turn; the reply streams
back. `/reset` starts over, `/exit` (or end of input) quits."""

from __future__ import annotations

import argparse
import sys

from inferd.commands.engine_args import (
    add_engine_arguments,
    add_sampling_arguments,
    engine_config_from_args,
    sampling_params_from_args,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    add_sampling_arguments(parser)
    parser.add_argument("--system", default=None, help="a system message")
    parser.add_argument("--chat-template", default=None, help="template file or text")


def run(args: argparse.Namespace) -> int:
    from inferd.engine.engine import LLMEngine
    from inferd.tokenizer.chat_template import load_chat_template

    engine = LLMEngine(engine_config_from_args(args))
    tok = engine.tokenizer
    if args.chat_template:
        tok.chat_template = load_chat_template(args.chat_template)
    params = sampling_params_from_args(args)
    history: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    turn = 0
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line or line.strip() == "/exit":
            return 0
        if line.strip() == "/reset":
            history = history[:1] if args.system else []
            continue
        history.append({"role": "user", "content": line.rstrip("\n")})
        ids = tok.encode_chat(history, add_generation_prompt=True)
        turn += 1
        engine.add_request(f"chat-{turn}", {"prompt_token_ids": ids}, params, stream=True)
        sent, reply = 0, ""
        while engine.has_unfinished_requests():
            for out in engine.step():
                reply = out.outputs[0].text
                sys.stdout.write(reply[sent:])
                sys.stdout.flush()
                sent = len(reply)
        sys.stdout.write("\n")
        history.append({"role": "assistant", "content": reply})

"""`inferd chat`: a terminal conversation. Each line you type is a user turn; the reply streams
back to stdout. Commands: /reset starts a new conversation, /exit (or end of input) quits.

Without --model it talks to the pulled chat model (`inferd pull smollm2-135m-instruct`) when
the cache has one; otherwise to the embedded model, which is a base model and says so first.
"""

from __future__ import annotations

import argparse
import sys

from inferd.commands.engine_args import (
    CHAT_FALLBACK,
    add_engine_arguments,
    add_sampling_arguments,
    engine_config_from_args,
    model_sampling_defaults,
    sampling_params_from_args,
)
from inferd.commands.startup_gc import engine_started

COMMANDS_HELP = """\
while chatting:
  /reset   forget the conversation so far (the --system message stays)
  /exit    quit (so does end of input, Ctrl-D)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (__doc__ or "").split("\n\n")[0]
    parser.epilog = COMMANDS_HELP
    add_engine_arguments(parser)
    parser.set_defaults(model=None)
    for action in parser._actions:
        if action.dest == "model":  # chat's default model differs from the other commands'
            action.help = (
                "a GGUF file, an HF folder, or a name from `inferd models` (default: the "
                "pulled chat model smollm2-135m-instruct if present, else the embedded base "
                "model gemma-3-270m)"
            )
    add_sampling_arguments(parser, CHAT_FALLBACK)
    parser.add_argument("--system", default=None,
                        help="a system message (default: none, the template's own)")  # fmt: skip
    parser.add_argument("--chat-template", default=None,
                        help="template file or text (default: the model's)")  # fmt: skip


def choose_model(args: argparse.Namespace) -> None:
    """No --model: the pulled chat model, else the embedded base model with a one-line note."""
    if args.model:
        return
    from inferd.loader.catalog import EMBEDDED, SMOLLM2_INSTRUCT, chat_model

    chosen = chat_model()
    if chosen is not None:
        args.model = chosen.name
        return
    print(
        f"inferd chat: the embedded {EMBEDDED.name} is a base model (it continues text, it "
        f"does not chat); for a chat model run: inferd pull {SMOLLM2_INSTRUCT.name}",
        file=sys.stderr,
    )


def run(args: argparse.Namespace) -> int:
    from inferd.engine.frontend.llm_engine import LLMEngine
    from inferd.tokenizer.template_files import load_chat_template

    sampling_params_from_args(args)  # bad flags fail before the model loads
    choose_model(args)
    engine = LLMEngine(engine_config_from_args(args))
    engine_started()
    tok = engine.tokenizer
    if args.chat_template:
        tok.chat_template = load_chat_template(args.chat_template)
    params = sampling_params_from_args(args, model_sampling_defaults(engine))
    history: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    turn = 0
    interactive = sys.stdin.isatty()
    if interactive:
        print("type a message; /reset starts over, /exit quits", file=sys.stderr)
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
        sent, reply, out = 0, "", None
        while engine.has_unfinished_requests():
            for out in engine.step():
                reply = out.outputs[0].text
                sys.stdout.write(reply[sent:])
                sys.stdout.flush()
                sent = len(reply)
        sys.stdout.write("\n")
        if out is not None and out.error:
            raise RuntimeError(out.error)
        history.append({"role": "assistant", "content": reply})

"""`inferd serve [MODEL]`: the OpenAI-compatible HTTP server (FastAPI + uvicorn).

Flags use vLLM's names. The model loads before the port opens, so a client that can connect
finds a ready server (`/health` answers 200 from the first connection). The engine core runs in
its own process (`--no-engine-core-process`: in this one, on a thread), or one core per replica
with `--data-parallel-size N`; this process is the front end (docs/architecture.md). If every
core dies, requests in flight get an error, new ones a 503, /health fails and the server exits
with status 1.
"""

from __future__ import annotations

import argparse
import logging

from inferd.commands.engine_args import engine_config_from_args
from inferd.commands.serve_app import model_app, serve_http, start_engine
from inferd.commands.serve_args import add_arguments
from inferd.commands.serve_disaggregation import disaggregates
from inferd.commands.serve_features import (
    check_tool_flags,
    cors_settings,
    with_request_limits,
)
from inferd.commands.serve_lora import lora_modules, runtime_updating
from inferd.commands.serve_model_flags import serves_many
from inferd.commands.serve_models import run_many
from inferd.commands.serve_ray import run_on_ray, uses_ray
from inferd.commands.serve_startup import show_startup_logs
from inferd.commands.startup_gc import engine_started

__all__ = ["add_arguments", "run"]  # the command (cli.py): its flags live in serve_args.py

log = logging.getLogger("inferd.serve")


def run(args: argparse.Namespace) -> int:
    split = disaggregates(args)  # --disaggregate: refused with what cannot go with it
    if serves_many(args):  # --model NAME=PATH ... or --models-dir (serve_models.py)
        return run_many(args)
    if uses_ray(args):  # the same server on Ray Serve, in front of engine replicas
        if args.enable_lora:
            raise ValueError("--enable-lora: LoRA adapters are not served on Ray yet")
        return run_on_ray(args)
    show_startup_logs()
    from inferd.tokenizer.chat_template import ChatTemplate
    from inferd.tokenizer.template_files import load_chat_template

    # Check the template and flags before the model loads: a typo should not cost a model load.
    template = load_chat_template(args.chat_template) if args.chat_template else None
    if args.profiler_dir:
        from inferd.profiling.trace import trace_directory

        args.profiler_dir = str(trace_directory(args.profiler_dir))  # writable, made absolute
    if template is not None:
        ChatTemplate(template)  # compiles: syntax errors surface now, with their line
    check_tool_flags(args)
    cors = cors_settings(args)
    adapters = lora_modules(args)  # each adapter's config checked before the model loads
    runtime_lora = runtime_updating(args)
    client, engine = start_engine(with_request_limits(engine_config_from_args(args), args), args,
                                  disaggregated=split)  # fmt: skip
    engine_started()
    app = model_app(args, client, engine, template, cors, adapters, runtime_lora)
    return serve_http(args, app, app.state.drain, client)

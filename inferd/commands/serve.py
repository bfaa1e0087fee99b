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
import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any

from inferd.commands.engine_args import add_engine_arguments, engine_config_from_args, size_arg
from inferd.commands.serve_api import add_api_arguments, api_settings
from inferd.commands.serve_features import (
    add_feature_arguments,
    check_tool_flags,
    cors_settings,
    tool_settings,
    with_request_limits,
)
from inferd.commands.serve_lora import add_lora_arguments, lora_modules, runtime_updating
from inferd.commands.serve_ray import add_ray_arguments, run_on_ray, uses_ray
from inferd.commands.startup_gc import engine_started

log = logging.getLogger("inferd.serve")

DEFAULT_MAX_QUEUED_TOKENS = 1 << 20  # prompt tokens waiting: minutes of prefill on a CPU


def _positive(kind: type):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from e
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return value

    return parse


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from e
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser, model_positional=True)
    add_lora_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port to listen on")
    parser.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="name(s) clients use for the model, the first reported (default: the model "
        "as given, e.g. smollm2-135m-instruct, else the embedded model's name)",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("INFERD_API_KEY"),
        help="require 'Authorization: Bearer KEY' on every route but /health "
        "and /metrics (default: $INFERD_API_KEY)",
    )
    parser.add_argument(
        "--chat-template",
        default=None,
        help="chat template file (.jinja, or .json with 'chat_template') or "
        "inline Jinja text; replaces the model's (default: the model's own)",
    )
    parser.add_argument(
        "--max-queued-requests",
        type=_positive(int),
        default=None,
        help="answer 503 (Retry-After) when this many requests already wait for a sequence "
        "slot; requests that can start at once never count, one with n samples counts n "
        "(default: no limit)",
    )
    parser.add_argument(
        "--max-queued-tokens",
        type=_positive(int),
        default=DEFAULT_MAX_QUEUED_TOKENS,
        help="answer 503 (Retry-After) when the prompts of the requests not yet started "
        "would hold more tokens; a request over it alone is a 400 (at least max_model_len)",
    )
    parser.add_argument(
        "--max-prompts-per-request",
        type=_positive(int),
        default=256,
        help="most prompts one completions request may carry (more is a 400)",
    )
    parser.add_argument(
        "--max-request-bytes",
        type=size_arg,
        default=None,
        help="largest request body, e.g. 1MiB (default 16MiB); larger is 413",
    )
    parser.add_argument(
        "--stall-timeout",
        type=float,
        default=60.0,
        help="/health answers 503 when no engine step finished for this many seconds, plus "
        "what the largest step may take at the speed of recent ones, while requests are pending",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=_non_negative,
        default=20.0,
        help="on SIGTERM/SIGINT: refuse new requests (503) and let those in flight run this "
        "many seconds before ending them (streams get an error event and [DONE])",
    )
    parser.add_argument(
        "--disable-log-requests",
        action="store_true",
        help="no access line (method, path, status, latency) per request on stderr",
    )
    parser.add_argument(
        "--profiler-dir",
        default=None,
        help="offer POST /start_profile and /stop_profile, which write torch.profiler traces "
        "here (default: no profiling routes; docs/profiling.md)",
    )
    parser.add_argument(
        "--enable-request-timeline",
        action="store_true",
        help='return a request\'s timeline when it asks ("return_timeline": true); off by '
        "default: its cached-prefix count shows whether others sent the same prompt",
    )
    parser.add_argument(
        "--disable-dashboard",
        action="store_true",
        help="serve no chat page at / and no dashboard at /dashboard (default: both, behind "
        "--api-key: the dashboard shows every request's sizes and timeline, never its text)",
    )
    parser.add_argument(
        "--engine-core-process",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the engine core (scheduler, model, sampler) in its own process, the HTTP "
        "front end (tokenizing, detokenizing, streaming) in this one; --no-engine-core-process "
        "runs it on a thread of this process",
    )
    parser.add_argument(
        "--data-parallel-size",
        "-dp",
        type=_positive(int),
        default=1,
        help="engine core replicas, each a process with its own copy of the model and KV cache "
        "and its share of the CPU cores (threads x replicas <= cores)",
    )
    parser.add_argument(
        "--data-parallel-routing",
        default="prefix",
        choices=["prefix", "round-robin", "least-loaded"],
        help="which replica gets a request: prefix (the one whose prefix cache holds the most "
        "of its prompt, unless it is much busier than the least loaded), round-robin, or "
        "least-loaded",
    )
    add_feature_arguments(parser)
    add_api_arguments(parser)
    add_ray_arguments(parser)


@dataclass
class ServedModel:
    """What the front end knows of the served model, wherever the engine core runs."""

    tokenizer: Any
    model_config: Any
    checkpoint: Any
    max_model_len: int
    max_num_seqs: int

    @classmethod
    def of_engine(cls, engine) -> ServedModel:
        """The model an in-process `LLMEngine` serves."""
        return cls(engine.tokenizer, engine.model_config, engine.setup.checkpoint,
                   engine.max_model_len, engine.setup.max_num_seqs)  # fmt: skip


def _start_engine(config, args: argparse.Namespace):
    """(the EngineClient the server uses, the served model): loads the model(s) now."""
    if not args.engine_core_process:
        if args.data_parallel_size > 1:
            raise ValueError("--data-parallel-size needs the engine core in its own process: "
                             "drop --no-engine-core-process")  # fmt: skip
        from inferd.engine.async_engine import AsyncEngine
        from inferd.engine.engine import LLMEngine

        engine = LLMEngine(config)
        return AsyncEngine(engine, args.stall_timeout), ServedModel.of_engine(engine)
    from inferd.engine.core_client import AsyncCoreClient

    client = AsyncCoreClient(config, args.data_parallel_size, args.data_parallel_routing,
                             args.stall_timeout)  # fmt: skip
    client.launch()
    log.info("engine core processes: %s", ", ".join(map(str, client.pids)))
    model = ServedModel(client.tokenizer, client.model_config, client.checkpoint,
                        client.max_model_len, client.max_num_seqs)  # fmt: skip
    return client, model


def _show_startup_logs() -> None:
    # The CLI's default level is WARNING; a server's startup lines (model, template, address)
    # are what its operator reads, so they show unless the user asked for less.
    if logging.getLogger().getEffectiveLevel() == logging.WARNING:
        for name in ("inferd.serve", "inferd.server.app", "inferd.access"):
            logging.getLogger(name).setLevel(logging.INFO)


def _set_chat_template(engine: ServedModel, template: str | None) -> None:
    from inferd.tokenizer.template_files import default_chat_template

    tok = engine.tokenizer
    if template:
        tok.chat_template = template
        log.info("chat template: from --chat-template")
        return
    tok.compiled_chat_template()  # the model's own: a broken one stops the start, not a request
    default = default_chat_template(engine.model_config.architecture)
    gguf = engine.checkpoint.gguf
    shipped = gguf is not None and gguf.metadata.get("tokenizer.chat_template")
    if tok.chat_template is None:
        log.warning(
            "this model has no chat template: /v1/chat/completions answers 400 until "
            "one is given with --chat-template"
        )
    elif default is not None and not shipped and tok.chat_template == default:
        log.info(
            "chat template: the model file has none; using inferd's bundled %s template "
            "(override with --chat-template)",
            engine.model_config.architecture,
        )
    else:
        log.info("chat template: the model's own (override with --chat-template)")


def run(args: argparse.Namespace) -> int:
    if uses_ray(args):  # the same server on Ray Serve, in front of engine replicas
        if args.enable_lora:
            raise ValueError("--enable-lora: LoRA adapters are not served on Ray yet")
        return run_on_ray(args)
    _show_startup_logs()
    import uvicorn

    from inferd.server.app import DEFAULT_MAX_REQUEST_BYTES, ServerSettings, create_app
    from inferd.server.drain import DrainingServer
    from inferd.tokenizer.byte_bound import max_bytes_per_token
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
    client, engine = _start_engine(with_request_limits(engine_config_from_args(args), args), args)
    engine_started()
    _set_chat_template(engine, template)
    model_arg = args.model or args.model_pos
    max_queued_tokens = max(args.max_queued_tokens, engine.max_model_len)
    if max_queued_tokens != args.max_queued_tokens:
        log.warning("--max-queued-tokens raised to max_model_len (%d): one prompt must fit",
                    engine.max_model_len)  # fmt: skip
    settings = ServerSettings(
        # Like vLLM: the name clients send is the model argument as given, unless renamed.
        served_model_names=args.served_model_name or ([model_arg] if model_arg else []),
        api_key=args.api_key or None,
        max_request_bytes=args.max_request_bytes or DEFAULT_MAX_REQUEST_BYTES,
        log_requests=not args.disable_log_requests,
        tools=tool_settings(engine, args),
        cors=cors,
        profiler_dir=args.profiler_dir,
        enable_request_timeline=args.enable_request_timeline,
        dashboard=not args.disable_dashboard,
        seats=engine.max_num_seqs * args.data_parallel_size,
        max_queued_requests=args.max_queued_requests,
        max_queued_tokens=max_queued_tokens,
        max_prompts_per_request=args.max_prompts_per_request,
        max_bytes_per_token=max_bytes_per_token(engine.tokenizer.backend),
        shutdown_timeout_s=args.shutdown_timeout,
        api=api_settings(args),
        lora_modules=adapters,
        allow_runtime_lora_updating=runtime_lora,
    )
    app = create_app(client, settings)
    level = logging.getLogger().getEffectiveLevel()
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        access_log=False,  # inferd.access logs each request, with its latency
        log_level=logging.getLevelName(level).lower(),
        # Backstop only: the drain (server/drain.py) has ended every request by then.
        timeout_graceful_shutdown=5,
    )
    server = DrainingServer(config, app.state.drain)
    _exit_when_dead(client, server)
    log.info(
        "starting the HTTP server on http://%s:%d%s",
        args.host,
        args.port,
        " (API key required)" if settings.api_key else "",
    )
    server.run()
    if getattr(client, "dead_reason", None) is not None:
        log.error("the engine is dead (%s): exiting", client.dead_reason)
        return 1
    return 0 if server.started else 1


def _exit_when_dead(client, server) -> None:
    """When every engine core has died: the streams in flight have their error by then; give
    them a moment to write it, then shut the server down (it exits with status 1)."""

    def dead() -> None:
        asyncio.get_running_loop().call_later(0.5, setattr, server, "should_exit", True)

    if hasattr(client, "on_dead"):
        client.on_dead = dead

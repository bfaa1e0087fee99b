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

from inferd.commands.engine_args import engine_config_from_args
from inferd.commands.serve_api import api_settings
from inferd.commands.serve_batch import batch_settings
from inferd.commands.serve_args import add_arguments
from inferd.commands.serve_features import (
    check_tool_flags,
    cors_settings,
    tool_settings,
    with_request_limits,
)
from inferd.commands.serve_lora import lora_modules, runtime_updating
from inferd.commands.serve_ray import run_on_ray, uses_ray
from inferd.commands.serve_startup import ServedModel, set_chat_template, show_startup_logs
from inferd.commands.startup_gc import engine_started

__all__ = ["add_arguments", "run"]  # the command (cli.py): its flags live in serve_args.py

log = logging.getLogger("inferd.serve")


def _start_engine(config, args: argparse.Namespace):
    """(the EngineClient the server uses, the served model): loads the model(s) now."""
    if not args.engine_core_process:
        if args.data_parallel_size > 1:
            raise ValueError("--data-parallel-size needs the engine core in its own process: "
                             "drop --no-engine-core-process")  # fmt: skip
        from inferd.engine.frontend.async_engine import AsyncEngine
        from inferd.engine.frontend.llm_engine import LLMEngine

        engine = LLMEngine(config)
        return AsyncEngine(engine, args.stall_timeout), ServedModel.of_engine(engine)
    from inferd.engine.frontend.async_core_client import AsyncCoreClient

    client = AsyncCoreClient(config, args.data_parallel_size, args.data_parallel_routing,
                             args.stall_timeout)  # fmt: skip
    client.launch()
    log.info("engine core processes: %s", ", ".join(map(str, client.pids)))
    model = ServedModel(client.tokenizer, client.model_config, client.checkpoint,
                        client.max_model_len, client.max_num_seqs)  # fmt: skip
    return client, model


def run(args: argparse.Namespace) -> int:
    if uses_ray(args):  # the same server on Ray Serve, in front of engine replicas
        if args.enable_lora:
            raise ValueError("--enable-lora: LoRA adapters are not served on Ray yet")
        return run_on_ray(args)
    show_startup_logs()
    import uvicorn

    from inferd.commands.serve_catalog import LoaderCatalog
    from inferd.server.app import DEFAULT_MAX_REQUEST_BYTES, ServerSettings, create_app
    from inferd.server.http.drain import DrainingServer
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
    set_chat_template(engine, template)
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
        wake_on_request=args.wake_on_request,
        catalog=LoaderCatalog(),  # /api/pull (server/ollama/pull.py)
        batch=batch_settings(args),
    )
    app = create_app(client, settings)
    level = logging.getLogger().getEffectiveLevel()
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        access_log=False,  # inferd.access logs each request, with its latency
        log_level=logging.getLevelName(level).lower(),
        # Backstop only: the drain (server/http/drain.py) has ended every request by then.
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

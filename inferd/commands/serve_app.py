"""What `inferd serve` builds around one model: its engine client (the core processes started),
the server's app around that client, and the HTTP server that runs an app until a signal. A
single-model server (serve.py) runs one model's app; a server of many models
(serve_models.py) runs one per loaded model behind its dispatcher."""

from __future__ import annotations

import argparse
import asyncio
import logging

from inferd.commands.serve_api import api_settings
from inferd.commands.serve_batch import batch_settings
from inferd.commands.serve_features import tool_settings
from inferd.commands.serve_startup import ServedModel, set_chat_template

log = logging.getLogger("inferd.serve")


def start_engine(config, args: argparse.Namespace, disaggregated: bool = False):
    """(the EngineClient the server uses, the served model): loads the model(s) now;
    `disaggregated`: prefill and decode engines (serve_disaggregation.py)."""
    if not args.engine_core_process:
        if args.data_parallel_size > 1:
            raise ValueError("--data-parallel-size needs the engine core in its own process: "
                             "drop --no-engine-core-process")  # fmt: skip
        from inferd.engine.frontend.async_engine import AsyncEngine
        from inferd.engine.frontend.llm_engine import LLMEngine

        engine = LLMEngine(config)
        return AsyncEngine(engine, args.stall_timeout), ServedModel.of_engine(engine)
    from inferd.engine.frontend.async_core_client import AsyncCoreClient

    if disaggregated:
        from inferd.commands.serve_disaggregation import disaggregated_client

        client = disaggregated_client(config, args)
    else:
        client = AsyncCoreClient(config, args.data_parallel_size, args.data_parallel_routing,
                                 args.stall_timeout)  # fmt: skip
        client.launch()
    log.info("engine core processes: %s", ", ".join(map(str, client.pids)))
    model = ServedModel(client.tokenizer, client.model_config, client.checkpoint,
                        client.max_model_len, client.max_num_seqs)  # fmt: skip
    return client, model


def model_app(args: argparse.Namespace, client, engine: ServedModel, template: str | None,
              cors, adapters: list, runtime_lora: bool):  # fmt: skip
    """The server's app around a started engine client; `inferd serve` runs one, a server of
    many models (serve_models.py) one per loaded model."""
    from inferd.commands.serve_catalog import LoaderCatalog
    from inferd.server.app import DEFAULT_MAX_REQUEST_BYTES, ServerSettings, create_app
    from inferd.tokenizer.byte_bound import max_bytes_per_token

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
        seats=engine.max_num_seqs * generating_engines(args),
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
    return create_app(client, settings)


def generating_engines(args: argparse.Namespace) -> int:
    """Engine cores that run sequences to their end: the replicas, or the decode engines."""
    if getattr(args, "disaggregate", False):
        return args.decode_engines or 1
    return args.data_parallel_size


def serve_http(args: argparse.Namespace, app, drain, client=None) -> int:
    """Run uvicorn on `app` until a signal (drained first by `drain`) or, with `client`, until
    its every engine core died (exit status 1)."""
    import uvicorn

    from inferd.server.http.drain import DrainingServer

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
    server = DrainingServer(config, drain)
    if client is not None:
        _exit_when_dead(client, server)
    log.info(
        "starting the HTTP server on http://%s:%d%s",
        args.host,
        args.port,
        " (API key required)" if args.api_key else "",
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

"""`inferd serve --model NAME=PATH --model NAME2=PATH2 ... | --models-dir DIR`: many models in one
server, each loaded on its first request, in its own engine (core processes, KV pool) built
exactly as a single-model server builds its one (serve.py), behind a dispatcher
(server/multimodel/). `--max-loaded-models` bounds the engines alive at once (default 1: on a
CPU each model takes the cores' memory bandwidth and its own KV pool), `--max-loaded-memory`
the memory they hold (serve_model_memory.py counts it); `--idle-unload` unloads a model idle
that long. The engine flags apply to every model; the flags themselves: serve_model_flags.py.

A single `--model PATH` (or MODEL) serves one model exactly as before; the flags that name one
model's things (a chat template, LoRA adapters, served names) are refused with several.
"""

from __future__ import annotations

import argparse
import copy
import logging

from inferd.commands.serve_model_flags import DEFAULT_MAX_LOADED, check_many, model_specs

log = logging.getLogger("inferd.serve")


def model_loader(args: argparse.Namespace):
    """(name, path) → the app of that model, its engine started (blocking): what `inferd serve
    PATH --served-model-name NAME` would serve."""
    from inferd.commands.engine_args import engine_config_from_args
    from inferd.commands.serve_app import model_app, start_engine
    from inferd.commands.serve_features import with_request_limits
    from inferd.server.http.cors import CORSSettings

    def load(name: str, path: str):
        own = copy.copy(args)
        own.model, own.model_pos, own.served_model_name = path, None, [name]
        config = with_request_limits(engine_config_from_args(own), own)
        client, engine = start_engine(config, own)
        try:  # CORS is the dispatcher's (outermost), not each model's
            return model_app(own, client, engine, None, CORSSettings(), [], False)
        except BaseException:
            client.stop()
            raise

    return load


def model_estimator(args: argparse.Namespace):
    """(name, path) → the model's estimated memory (blocking): serve_model_memory.py."""
    from inferd.commands.engine_args import engine_config_from_args
    from inferd.commands.serve_model_memory import estimate_model

    def estimate(name: str, path: str):
        own = copy.copy(args)
        own.model, own.model_pos = path, None
        return estimate_model(engine_config_from_args(own), args.data_parallel_size)

    return estimate


def model_measure(args: argparse.Namespace):
    from inferd.commands.serve_model_memory import measure_model

    async def measure(app):
        return await measure_model(app, args.data_parallel_size, args.tensor_parallel_size)

    return measure


def build_server(args: argparse.Namespace, loader=None, estimator=None):
    """(the dispatcher wrapped in the key check and CORS, its drain). `loader`, `estimator`:
    what loads a model's app and estimates its memory (tests pass small ones)."""
    from starlette.middleware.cors import CORSMiddleware

    from inferd.commands.serve_features import check_tool_flags, cors_settings
    from inferd.commands.serve_model_stop import stop_engine
    from inferd.server.app import DEFAULT_MAX_REQUEST_BYTES
    from inferd.server.http.auth import APIKeyMiddleware
    from inferd.server.multimodel.dispatcher import Dispatcher, DispatchSettings
    from inferd.server.multimodel.drain import PoolDrain
    from inferd.server.multimodel.memory import size_text
    from inferd.server.multimodel.metrics import ModelMetrics
    from inferd.server.multimodel.pool import ModelPool, ModelSlot

    check_many(args)
    check_tool_flags(args)
    cors = cors_settings(args)
    specs = model_specs(args)
    metrics = ModelMetrics(list(specs))
    max_loaded = args.max_loaded_models or DEFAULT_MAX_LOADED
    budget = args.max_loaded_memory
    pool = ModelPool({n: ModelSlot(n, p) for n, p in specs.items()}, loader or model_loader(args),
                     max_loaded, args.idle_unload, metrics, budget,
                     estimator or model_estimator(args), model_measure(args),
                     stop_engine)  # fmt: skip
    settings = DispatchSettings(args.max_request_bytes or DEFAULT_MAX_REQUEST_BYTES,
                                args.max_queue_time)  # fmt: skip
    app = Dispatcher(pool, metrics, settings)
    if args.api_key:  # before a model loads: an unknown client must not make the server load
        app = APIKeyMiddleware(app, api_key=args.api_key)
    if cors.allow_credentials and "*" in cors.allowed_origins:
        raise ValueError("--allow-credentials needs explicit --allowed-origins, not '*'")
    app = CORSMiddleware(app, allow_origins=cors.allowed_origins,
                         allow_methods=cors.allowed_methods, allow_headers=cors.allowed_headers,
                         allow_credentials=cors.allow_credentials)  # fmt: skip
    log.info("serving %d models, at most %d loaded at once%s, %s: %s", len(specs), max_loaded,
             " (--max-loaded-models)" if args.max_loaded_models else " (the default; "
             "--max-loaded-models)", f"holding at most {size_text(budget)} together "
             "(--max-loaded-memory)" if budget else "no memory budget (--max-loaded-memory)",
             ", ".join(specs))  # fmt: skip
    return app, PoolDrain(pool)


def run_many(args: argparse.Namespace) -> int:
    from inferd.commands.serve_app import serve_http
    from inferd.commands.serve_startup import show_startup_logs
    from inferd.commands.startup_gc import engine_started

    show_startup_logs()
    app, drain = build_server(args)
    engine_started()  # no engine yet: the collector runs again from here
    return serve_http(args, app, drain)

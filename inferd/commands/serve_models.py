"""`inferd serve --model NAME=PATH --model NAME2=PATH2 ... | --models-dir DIR`: many models in one
server, each loaded on its first request, in its own engine (core processes, KV pool) built
exactly as a single-model server builds its one (serve.py), behind a dispatcher
(server/multimodel/). `--max-loaded-models` bounds the engines alive at once (default 1: on a
CPU each model takes the cores' memory bandwidth and its own KV pool), `--max-loaded-memory`
the memory they hold (serve_model_memory.py counts it); `--idle-unload` unloads a model idle
that long. The engine flags apply to every model.

A single `--model PATH` (or MODEL) serves one model exactly as before; the flags that name one
model's things (a chat template, LoRA adapters, served names) are refused with several.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import re
from pathlib import Path

log = logging.getLogger("inferd.serve")

DEFAULT_MAX_LOADED = 1
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
# Flags about one model's own things, refused with several models: (dest, why).
_PER_MODEL_FLAGS = (
    ("served_model_name", "each model is served under its NAME (--model NAME=PATH) or its "
     "file or folder name (--models-dir)"),
    ("chat_template", "one template cannot fit every model; each uses its own"),
    ("lora_modules", "an adapter belongs to one base model: serve that model alone"),
    ("enable_lora", "adapters are served only with one model"),
    ("allow_runtime_lora_updating", "adapters are served only with one model"),
    ("ray", "Ray Serve runs one model per application: run one application per model"),
)  # fmt: skip


def add_models_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--models-dir",
        default=None,
        metavar="DIR",
        help="serve every GGUF file (named by its file name without .gguf) and HF folder (with "
        "a config.json, named by the folder's name) in DIR, loaded on request (default: none)",
    )
    parser.add_argument(
        "--max-loaded-models",
        type=int,
        default=None,
        metavar="N",
        help="with several models: most models loaded at once; loading another unloads the "
        f"least recently used idle one (default {DEFAULT_MAX_LOADED})",
    )
    parser.add_argument(
        "--max-loaded-memory",
        type=_size,
        default=None,
        metavar="SIZE",
        help="with several models: most memory the loaded models may hold together (weights, "
        "KV pool and runtime of every engine process, estimated before a load and measured "
        "after it), e.g. 8GiB; loading another unloads the least recently used idle ones until "
        "it fits (default: no budget)",
    )
    parser.add_argument(
        "--idle-unload",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with several models: unload a model that had no request for this many seconds "
        "(default: never; it stays until another model needs its seat)",
    )


def _size(text: str) -> int:
    from inferd.commands.engine_args import size_arg

    return size_arg(text)


def _split(value: str) -> tuple[str | None, str]:
    """(NAME, PATH) of `NAME=PATH`; (None, value) for a plain path or catalog name. A value that
    is an existing path stays a path even with a '=' in it."""
    name, eq, path = value.partition("=")
    if not eq or os.path.exists(value) or not _NAME.fullmatch(name):
        return None, value
    return name, path


def serves_many(args: argparse.Namespace) -> bool:
    """Whether the flags ask for several models (checked: a mix that means nothing is refused)."""
    values = getattr(args, "models", None) or []
    named = [v for v in values if _split(v)[0] is not None]
    many = bool(args.models_dir or named or len(values) > 1)
    if not many:
        for flag in ("max_loaded_models", "max_loaded_memory", "idle_unload"):
            if getattr(args, flag) is not None:
                raise ValueError(f"--{flag.replace('_', '-')}: only with several models "
                                 "(--model NAME=PATH, --models-dir)")  # fmt: skip
        return False
    if len(named) != len(values):
        plain = next(v for v in values if _split(v)[0] is None)
        raise ValueError(f"--model {plain}: with several models give each as --model NAME=PATH")
    if args.model_pos:
        raise ValueError(f"MODEL {args.model_pos}: with several models give each as "
                         "--model NAME=PATH")  # fmt: skip
    return True


def model_specs(args: argparse.Namespace) -> dict[str, str]:
    """name → path (or catalog name) of every model served; refuses two names for one path."""
    pairs = [_split(v) for v in args.models]
    if args.models_dir:
        pairs += _scan(Path(args.models_dir))
    specs: dict[str, str] = {}
    owner: dict[str, str] = {}  # the model's identity → the name that serves it
    for name, path in pairs:
        if name in specs:
            raise ValueError(f"--model {name}={path}: the name {name!r} is already served "
                             f"({specs[name]})")  # fmt: skip
        key = _identity(path)
        if key in owner:
            raise ValueError(f"--model {name}={path}: {path} is already served as "
                             f"{owner[key]!r}; serve one model under one name")  # fmt: skip
        specs[name], owner[key] = path, name
    return specs


def _scan(folder: Path) -> list[tuple[str, str]]:
    if not folder.is_dir():
        raise ValueError(f"--models-dir {folder}: not a folder")
    found = []
    for entry in sorted(folder.iterdir()):
        if entry.is_file() and entry.suffix == ".gguf":
            found.append((entry.stem, str(entry)))
        elif entry.is_dir() and (entry / "config.json").is_file():
            found.append((entry.name, str(entry)))
    if not found:
        raise ValueError(f"--models-dir {folder}: no GGUF file or HF folder (with config.json)")
    return found


def _identity(path: str) -> str:
    if os.path.exists(path):
        return os.path.realpath(path)
    from inferd.loader.catalog import lookup

    model = lookup(path)  # a catalog name: its file
    return os.path.realpath(model.path) if model is not None else path


def check_many(args: argparse.Namespace) -> None:
    """Refuse what cannot work per model, naming the flag."""
    for dest, why in _PER_MODEL_FLAGS:
        if getattr(args, dest, None):
            raise ValueError(f"--{dest.replace('_', '-')}: not with several models: {why}")
    if args.max_loaded_models is not None and args.max_loaded_models < 1:
        raise ValueError(f"--max-loaded-models must be at least 1, got {args.max_loaded_models}")
    if args.idle_unload is not None and not args.idle_unload > 0:
        raise ValueError(f"--idle-unload must be a number of seconds > 0, got {args.idle_unload}")
    if args.max_loaded_memory is not None and args.kv_cache_memory is None:
        from inferd.platform import resolve_device

        if resolve_device(args.device).type == "cuda":
            raise ValueError("--max-loaded-memory on a GPU needs --kv-cache-memory: without it "
                             "each model's engine sizes its KV pool to fill "
                             "--gpu-memory-utilization of the device, so no budget could hold "
                             "two models")  # fmt: skip
    from inferd.distributed.launch import launched_by_torchrun

    if launched_by_torchrun():  # its ranks would have to build every model in step
        raise ValueError("several models are not served under torchrun: launch inferd serve "
                         "directly (--tensor-parallel-size starts each model's ranks)")  # fmt: skip


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

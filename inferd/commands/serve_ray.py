"""`inferd serve --ray ...`: the same server on Ray Serve, an ingress in front of engine replicas
(inferd/ray_serve/, docs/ray.md), and `build_app`, the application builder for Ray's own tools:

    inferd serve --ray --num-replicas 2                  # starts a local Ray cluster
    inferd serve --ray --ray-address auto --min-replicas 1 --max-replicas 4
    serve run inferd.commands.serve_ray:build_app model=smollm2-135m-instruct num_replicas=2
    serve deploy docs/ray_serve.yaml                     # the same builder, from a config file

Every `inferd serve` flag keeps its meaning: each replica builds its engine as `inferd serve`
does (`make_engine`), and the ingress its ServerSettings (`make_settings`). The builder's
arguments are those flags, by name (`max_model_len=2048`, `enable_prefix_caching=false`).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import signal
import sys
import threading
from typing import Any

from inferd.ray_serve.options import DEFAULT_ROUTER, ROUTERS, RayOptions

log = logging.getLogger("inferd.serve")

# Flags `inferd serve` has that the Ray path cannot honour (refused, never ignored).
_NOT_ON_RAY = {"profiler_dir": "traces are taken per engine: run `inferd serve --profiler-dir`"}
_RAY_FLAGS = ("ray_address", "num_replicas", "min_replicas", "max_replicas",
              "autoscaling_config", "replica_cpus", "replica_gpus", "max_replicas_per_node",
              "max_ongoing_requests", "request_router", "router_imbalance")  # fmt: skip
# Builder arguments Serve itself decides (serve run / the config file's http_options).
_NOT_IN_BUILDER = ("host", "port", "ray", "ray_address")


def _positive(kind: type):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from e
        if value < 0 or (kind is int and value < 1):
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return value

    return parse


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}") from e
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Ray Serve (replicas behind one endpoint; docs/ray.md)")
    g.add_argument("--ray", action="store_true",
                   help="serve on Ray Serve: the same API in front of engine replicas (needs "
                        "the ray extra: pip install 'inferd[ray]')")  # fmt: skip
    g.add_argument("--ray-address", default=None,
                   help="the Ray cluster to join: auto (the one `ray start` runs here) or "
                        "HOST:PORT (default: start a local cluster for this command)")  # fmt: skip
    g.add_argument("--num-replicas", type=_positive(int), default=1,
                   help="engine replicas, each with its own model copy and KV cache")  # fmt: skip
    g.add_argument(
        "--min-replicas",
        type=_positive(int),
        default=None,
        help="autoscale: at least this many replicas (default 1 with --max-replicas)",
    )
    g.add_argument(
        "--max-replicas",
        type=_positive(int),
        default=None,
        help="autoscale: at most this many replicas, by Serve's count of ongoing requests "
        "(default: no autoscaling, --num-replicas)",
    )
    g.add_argument("--autoscaling-config", type=_json_object, default=None, metavar="JSON",
                   help="Serve's other autoscaling fields, e.g. '{\"target_ongoing_requests\": "
                        "4, \"downscale_delay_s\": 60}' (default: Serve's)")  # fmt: skip
    g.add_argument(
        "--replica-cpus",
        type=_positive(float),
        default=1.0,
        help="CPUs Ray reserves per replica; also its threads unless --threads",
    )
    g.add_argument(
        "--replica-gpus",
        type=_positive(float),
        default=0.0,
        help="GPUs Ray reserves per replica (1 on a GPU machine)",
    )
    g.add_argument(
        "--max-replicas-per-node",
        type=_positive(int),
        default=None,
        help="spread replicas: at most this many on one Ray node (default: no bound)",
    )
    g.add_argument("--max-ongoing-requests", type=_positive(int), default=None,
                   help="requests one replica takes at once; more wait in the router "
                        "(default: --max-num-seqs, else the engine's default)")  # fmt: skip
    g.add_argument("--request-router", choices=sorted(ROUTERS), default=DEFAULT_ROUTER,
                   help="prefix: inferd's, on the engines' KV block hashes (exact prefix "
                        "affinity, load-bounded); ray-prefix: Ray's PrefixCacheAffinityRouter "
                        "on prompt text; pow2: Serve's power of two choices")  # fmt: skip
    g.add_argument("--router-imbalance", type=int, default=8,
                   help="prefix routers: send a request to the replica holding its prefix "
                        "unless that one has more than this many requests beyond the least "
                        "loaded")  # fmt: skip


def uses_ray(args: argparse.Namespace) -> bool:
    """Whether `inferd serve` runs on Ray: --ray, or a Ray flag (refused without --ray)."""
    defaults = argparse.ArgumentParser(add_help=False)
    add_ray_arguments(defaults)
    given = [f for f in _RAY_FLAGS if getattr(args, f) != defaults.get_default(f)]
    if given and not args.ray:
        raise ValueError(f"--{given[0].replace('_', '-')} needs --ray")
    return bool(args.ray)


def ray_options(args: argparse.Namespace) -> RayOptions:
    from inferd.config import ENGINE_DEFAULTS

    for name, why in _NOT_ON_RAY.items():
        if getattr(args, name, None):
            raise ValueError(f"--{name.replace('_', '-')} is not available with --ray: {why}")
    if args.tensor_parallel_size > 1:
        raise ValueError("--tensor-parallel-size > 1 is not available with --ray (a replica "
                         "runs one engine process); scale out with --num-replicas")  # fmt: skip
    device = "cuda" if args.replica_gpus else "cpu"
    ongoing = (args.max_ongoing_requests or args.max_num_seqs
               or ENGINE_DEFAULTS[device]["max_num_seqs"])  # fmt: skip
    return RayOptions(
        num_replicas=args.num_replicas,
        min_replicas=args.min_replicas,
        max_replicas=args.max_replicas,
        autoscaling_config=args.autoscaling_config or {},
        replica_cpus=args.replica_cpus,
        replica_gpus=args.replica_gpus,
        max_replicas_per_node=args.max_replicas_per_node,
        max_ongoing_requests=ongoing,
        request_router=args.request_router,
        router_imbalance=args.router_imbalance,
        block_size=args.block_size,
        shutdown_timeout_s=args.shutdown_timeout,
    )


# ---- what runs in the Ray workers ------------------------------------------------------------
def _worker_logging(args: argparse.Namespace) -> None:
    """A Ray worker has none of the CLI's logging set-up: the same level, format and quiet."""
    from inferd.commands.serve import _show_startup_logs
    from inferd.progress import set_quiet

    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")  # fmt: skip
    set_quiet(args.quiet)
    _show_startup_logs()


def make_engine(args: argparse.Namespace):
    """In each replica: the engine as `inferd serve` builds it, behind its EngineClient."""
    from inferd.commands.engine_args import engine_config_from_args
    from inferd.commands.serve import _set_chat_template
    from inferd.commands.serve_features import with_request_limits
    from inferd.commands.startup_gc import engine_started
    from inferd.engine.async_engine import AsyncEngine
    from inferd.engine.engine import LLMEngine
    from inferd.ray_serve.replica import ReplicaEngine
    from inferd.ray_serve.wire import EngineFacts
    from inferd.tokenizer.byte_bound import max_bytes_per_token
    from inferd.tokenizer.template_files import load_chat_template

    _worker_logging(args)
    template = load_chat_template(args.chat_template) if args.chat_template else None
    engine = LLMEngine(with_request_limits(engine_config_from_args(args), args))
    engine_started()
    _set_chat_template(engine, template)
    blocks = engine.setup.kv_plan.num_blocks  # per KV group (full attention, sliding windows)
    facts = EngineFacts(engine.model_config, engine.setup.max_num_seqs, engine.config.block_size,
                        min(blocks) if isinstance(blocks, list | tuple) else int(blocks),
                        max_bytes_per_token(engine.tokenizer.backend))  # fmt: skip
    return ReplicaEngine(AsyncEngine(engine, args.stall_timeout), facts)


def make_settings(args: argparse.Namespace, max_replicas: int, description):
    """In the ingress: `inferd serve`'s ServerSettings, for the model the replicas describe."""
    from types import SimpleNamespace

    from inferd.commands.serve_api import api_settings
    from inferd.commands.serve_features import cors_settings, tool_settings
    from inferd.server.app import DEFAULT_MAX_REQUEST_BYTES, ServerSettings

    _worker_logging(args)
    info, facts = description.model_info, description.facts
    # tool_settings reads the engine's tokenizer and model config only.
    engine_view = SimpleNamespace(tokenizer=description.tokenizer, model_config=facts.model_config)
    model_arg = args.model or args.model_pos
    return ServerSettings(
        served_model_names=args.served_model_name or ([model_arg] if model_arg else []),
        api_key=args.api_key or None,
        max_request_bytes=args.max_request_bytes or DEFAULT_MAX_REQUEST_BYTES,
        log_requests=not args.disable_log_requests,
        tools=tool_settings(engine_view, args),
        cors=cors_settings(args),
        enable_request_timeline=args.enable_request_timeline,
        seats=facts.max_num_seqs * max_replicas,  # every replica's batch at once
        max_queued_requests=args.max_queued_requests,
        max_queued_tokens=max(args.max_queued_tokens, info.max_model_len),
        max_prompts_per_request=args.max_prompts_per_request,
        max_bytes_per_token=facts.max_bytes_per_token,
        shutdown_timeout_s=args.shutdown_timeout,
        api=api_settings(args),
    )


# ---- the application -------------------------------------------------------------------------
def _checked_early(args: argparse.Namespace) -> None:
    """What `inferd serve` checks before loading a model, checked before any replica starts."""
    from inferd.commands.serve_features import check_tool_flags, cors_settings
    from inferd.tokenizer.chat_template import ChatTemplate
    from inferd.tokenizer.template_files import load_chat_template

    if args.chat_template:
        ChatTemplate(load_chat_template(args.chat_template))
    check_tool_flags(args)
    cors_settings(args)


def application(args: argparse.Namespace):
    """The Serve application of these `inferd serve --ray` flags."""
    try:
        from inferd.ray_serve.app import build_application
    except ImportError as e:
        raise ValueError("--ray needs Ray Serve: pip install 'inferd[ray]' "
                         f"(ray[serve]==2.60.0): {e}") from e  # fmt: skip
    options = ray_options(args)
    _checked_early(args)
    # Only plain values travel to the workers (not the parser's module references).
    shipped = argparse.Namespace(**{k: v for k, v in vars(args).items() if not k.startswith("_")})
    shipped.log_level = getattr(args, "log_level", "WARNING")
    shipped.quiet = getattr(args, "quiet", False)
    return build_application(functools.partial(make_engine, shipped),
                             functools.partial(make_settings, shipped, options.replica_range[1]),
                             options)  # fmt: skip


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would exit the process
        raise ValueError(message)


def builder_argv(values: dict[str, Any], parser: argparse.ArgumentParser) -> list[str]:
    """`serve run ... key=value` arguments as `inferd serve` flags."""
    actions = {a.dest: a for a in parser._actions if a.option_strings}  # NOTE: no public list
    argv: list[str] = []
    for key, value in values.items():
        dest = key.replace("-", "_")
        if dest in _NOT_IN_BUILDER:
            raise ValueError(f"{key}: set by Serve (serve run, or the config file's "
                             "http_options), not by the application's arguments")  # fmt: skip
        action = actions.get(dest)
        if action is None:
            raise ValueError(f"unknown argument {key!r}: the arguments are `inferd serve` "
                             "flags, e.g. model=... num_replicas=2 max_model_len=2048")  # fmt: skip
        flag = action.option_strings[0]
        if action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction):
            on = _truth(key, value)
            if isinstance(action, argparse.BooleanOptionalAction):
                argv.append(flag if on else "--no-" + flag.removeprefix("--"))
            elif on:
                argv.append(flag)
        elif action.nargs == "+":
            items = value if isinstance(value, list) else str(value).replace(",", " ").split()
            argv += [flag, *map(str, items)]
        else:
            text = json.dumps(value) if isinstance(value, dict | list) else str(value)
            argv += [flag, text]
    return argv


def _truth(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{key}: expected true or false, got {value!r}")


def parse_builder_args(values: dict[str, Any]) -> argparse.Namespace:
    from inferd.commands import serve

    parser = _RaisingParser(prog="inferd.commands.serve_ray:build_app", add_help=False)
    serve.add_arguments(parser)
    args = parser.parse_args(builder_argv(values, parser))
    args.ray = True
    return args


def build_app(values: dict[str, Any]):
    """Serve's application builder: `serve run inferd.commands.serve_ray:build_app k=v ...`."""
    return application(parse_builder_args(dict(values)))


# ---- inferd serve --ray ----------------------------------------------------------------------
def run_on_ray(args: argparse.Namespace) -> int:
    from inferd.commands.serve import _show_startup_logs

    _show_startup_logs()
    app = application(args)  # every check before a cluster starts
    import ray
    from ray import serve

    from inferd.ray_serve.app import APP_NAME

    ours = args.ray_address is None
    ray.init(address=args.ray_address, include_dashboard=False if ours else None,
             logging_level=logging.WARNING)  # fmt: skip
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        # HeadOnly: one HTTP proxy, on the head node, listening on --host/--port.
        serve.start(proxy_location="HeadOnly", http_options={"host": args.host, "port": args.port})
        log.info("deploying on Ray (%s): waiting for the engine replicas to load the model",
                 "a local cluster" if ours else args.ray_address)  # fmt: skip
        serve.run(app, name=APP_NAME, route_prefix="/")
        log.info("serving on http://%s:%d (Ray Serve; %s)", args.host, args.port,
                 _describe(args))  # fmt: skip
        stop.wait()
        log.info("shutting down: the requests in flight get up to %.0f s (--shutdown-timeout)",
                 args.shutdown_timeout)  # fmt: skip
        serve.delete(APP_NAME)
    finally:
        if ours:
            serve.shutdown()
        ray.shutdown()
    return 0


def _describe(args: argparse.Namespace) -> str:
    if args.min_replicas or args.max_replicas:
        scale = f"{args.min_replicas or 1} to {args.max_replicas or args.min_replicas} replicas"
    else:
        scale = f"{args.num_replicas} replica{'s' if args.num_replicas > 1 else ''}"
    return f"{scale}, router {args.request_router}"

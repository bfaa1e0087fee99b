"""`inferd serve --ray ...`: the same server on Ray Serve, an ingress in front of engine replicas
(inferd/ray_serve/, docs/ray.md), and `build_app`, the application builder for Ray's own tools:

    inferd serve --ray --num-replicas 2                  # starts a local Ray cluster
    inferd serve --ray --ray-address auto --min-replicas 1 --max-replicas 4
    serve run inferd.commands.serve_ray:build_app model=smollm2-135m-instruct num_replicas=2
    serve deploy docs/ray_serve.yaml                     # the same builder, from a config file

Every `inferd serve` flag keeps its meaning: each replica builds its engine as `inferd serve`
does, and the ingress its ServerSettings (serve_ray_factories.py). The builder's arguments are
those flags, by name (`max_model_len=2048`, `enable_prefix_caching=false`).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import signal
import threading
from typing import Any

from inferd.commands.serve_args import add_arguments
from inferd.commands.serve_ray_factories import make_engine, make_settings
from inferd.commands.serve_startup import show_startup_logs
from inferd.ray_serve.options import RayOptions

log = logging.getLogger("inferd.serve")

# Flags `inferd serve` has that the Ray path cannot honour (refused, never ignored).
_NOT_ON_RAY = {"profiler_dir": "traces are taken per engine: run `inferd serve --profiler-dir`",
               "wake_on_request": "a Serve handle reaches one replica per call, so the "
               "replicas cannot be put to sleep or woken (POST /sleep answers 501)"}  # fmt: skip
_RAY_FLAGS = ("ray_address", "num_replicas", "min_replicas", "max_replicas",
              "autoscaling_config", "replica_cpus", "replica_gpus", "max_replicas_per_node",
              "max_ongoing_requests", "request_router", "router_imbalance")  # fmt: skip
# Builder arguments Serve itself decides (serve run / the config file's http_options).
_NOT_IN_BUILDER = ("host", "port", "ray", "ray_address")


def uses_ray(args: argparse.Namespace) -> bool:
    """Whether `inferd serve` runs on Ray: --ray, or a Ray flag (refused without --ray)."""
    given = [f for f in _RAY_FLAGS if getattr(args, f, None) is not None]
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
    given = {
        "num_replicas": args.num_replicas,
        "min_replicas": args.min_replicas,
        "max_replicas": args.max_replicas,
        "autoscaling_config": args.autoscaling_config,
        "replica_cpus": args.replica_cpus,
        "replica_gpus": args.replica_gpus,
        "max_replicas_per_node": args.max_replicas_per_node,
        "request_router": args.request_router,
        "router_imbalance": args.router_imbalance,
    }
    return RayOptions(**{k: v for k, v in given.items() if v is not None},
                      max_ongoing_requests=ongoing, block_size=args.block_size,
                      shutdown_timeout_s=args.shutdown_timeout)  # fmt: skip


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
    parser = _RaisingParser(prog="inferd.commands.serve_ray:build_app", add_help=False)
    add_arguments(parser)
    args = parser.parse_args(builder_argv(values, parser))
    args.ray = True
    return args


def build_app(values: dict[str, Any]):
    """Serve's application builder: `serve run inferd.commands.serve_ray:build_app k=v ...`."""
    return application(parse_builder_args(dict(values)))


# ---- inferd serve --ray ----------------------------------------------------------------------
def run_on_ray(args: argparse.Namespace) -> int:
    show_startup_logs()
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
                 _describe(ray_options(args)))  # fmt: skip
        stop.wait()
        log.info("shutting down: the requests in flight get up to %.0f s (--shutdown-timeout)",
                 args.shutdown_timeout)  # fmt: skip
        serve.delete(APP_NAME)
    finally:
        if ours:
            serve.shutdown()
        ray.shutdown()
    return 0


def _describe(options: RayOptions) -> str:
    if options.autoscaling:
        low, high = options.replica_range
        scale = f"{low} to {high} replicas, autoscaled"
    else:
        scale = f"{options.num_replicas} replica{'s' if options.num_replicas > 1 else ''}"
    return f"{scale}, router {options.request_router}"

"""`inferd serve`'s flags (vLLM's names): the command (serve.py) and the Ray application builder
(serve_ray.py, which parses `serve run` arguments as these flags) both read them."""

from __future__ import annotations

import argparse
import os

from inferd.commands.engine_args import add_engine_arguments, size_arg
from inferd.commands.serve_api import add_api_arguments
from inferd.commands.serve_batch import add_batch_arguments
from inferd.commands.serve_disaggregation import add_disaggregation_arguments
from inferd.commands.serve_features import add_feature_arguments
from inferd.commands.serve_lora import add_lora_arguments
from inferd.commands.serve_model_flags import add_models_arguments
from inferd.commands.serve_ray_args import add_ray_arguments

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
    add_models_arguments(parser)  # several models: --models-dir, --max-loaded-models, ...
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
        "--max-queue-time",
        type=_positive(float),
        default=None,
        metavar="SECONDS",
        help="a request not yet scheduled this many seconds after it arrived gets a 503 "
        "(Retry-After) and leaves the queue; running requests are never cut (default: no limit)",
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
        "--wake-on-request",
        action="store_true",
        help="a request that arrives while the model sleeps (POST /sleep) wakes it and runs "
        "(default: it gets a 503 naming POST /wake_up)",
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
    add_batch_arguments(parser)
    add_ray_arguments(parser)
    add_disaggregation_arguments(parser)

"""The Ray Serve flags of `inferd serve` (serve_ray.py runs them): apart from the Ray command so
that `inferd serve`'s flag list (serve_args.py) and the Ray application builder, which parses
those flags, both build on them."""

from __future__ import annotations

import argparse
import json
from typing import Any

from inferd.ray_serve.options import DEFAULT_ROUTER, ROUTERS


def _at_least(kind: type, low: float):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from e
        if not value >= low:
            raise argparse.ArgumentTypeError(f"expected a number >= {low}, got {text!r}")
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
    # NOTE: every Ray flag defaults to None, so that one given without --ray is always seen
    # (and refused); RayOptions holds the real defaults, which the help states.
    g = parser.add_argument_group("Ray Serve (replicas behind one endpoint; docs/ray.md)")
    g.add_argument("--ray", action="store_true",
                   help="serve on Ray Serve: the same API in front of engine replicas (needs "
                        "the ray extra: pip install 'inferd[ray]')")  # fmt: skip
    g.add_argument("--ray-address",
                   help="the Ray cluster to join: auto (the one `ray start` runs here) or "
                        "HOST:PORT (default: start a local cluster for this command)")  # fmt: skip
    g.add_argument("--num-replicas", type=_at_least(int, 1),
                   help="engine replicas, each with its own model copy and KV cache "
                        "(default: 1)")  # fmt: skip
    g.add_argument("--min-replicas", type=_at_least(int, 1),
                   help="autoscale: at least this many replicas (default 1 with "
                        "--max-replicas)")  # fmt: skip
    g.add_argument("--max-replicas", type=_at_least(int, 1),
                   help="autoscale: at most this many replicas, by Serve's count of ongoing "
                        "requests (default: no autoscaling, --num-replicas)")  # fmt: skip
    g.add_argument("--autoscaling-config", type=_json_object, metavar="JSON",
                   help="Serve's other autoscaling fields, e.g. '{\"target_ongoing_requests\": "
                        "4, \"downscale_delay_s\": 60}' (default: Serve's)")  # fmt: skip
    g.add_argument("--replica-cpus", type=_at_least(float, 0),
                   help="CPUs Ray reserves per replica, also its engine threads unless "
                        "--threads (default: 1)")  # fmt: skip
    g.add_argument(
        "--replica-gpus",
        type=_at_least(float, 0),
        help="GPUs Ray reserves per replica (default: 0; 1 on a GPU machine)",
    )
    g.add_argument("--max-replicas-per-node", type=_at_least(int, 1),
                   help="spread replicas: at most this many on one Ray node (default: no "
                        "bound)")  # fmt: skip
    g.add_argument("--max-ongoing-requests", type=_at_least(int, 1),
                   help="requests one replica takes at once; more wait in the router "
                        "(default: --max-num-seqs, else the engine's default)")  # fmt: skip
    g.add_argument("--request-router", choices=sorted(ROUTERS),
                   help="prefix: inferd's, on the engines' KV block hashes (exact prefix "
                        "affinity, load-bounded); ray-prefix: Ray's PrefixCacheAffinityRouter "
                        "on prompt text; pow2: Serve's power of two choices (default: "
                        f"{DEFAULT_ROUTER})")  # fmt: skip
    g.add_argument("--router-imbalance", type=_at_least(int, 0),
                   help="prefix routers: send a request to the replica holding its prefix "
                        "unless that one has more than this many requests beyond the least "
                        "loaded (default: 8)")  # fmt: skip

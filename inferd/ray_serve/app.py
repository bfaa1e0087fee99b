"""The Serve application: one ingress deployment in front of N engine replicas.

    HTTP ──▶ Serve proxy ──▶ InferdIngress (1 replica: inferd's FastAPI app, RayEngineClient)
                                  │ handle.generate, routed by the request router
                                  ▼
                             InferdEngine × N (an inferd engine each; num_replicas, or
                                               autoscaling between min and max)

`build_application` takes the two factories that make it inferd's: `make_engine` (run in each
replica: the engine client and its facts) and `make_settings` (run in the ingress: the
ServerSettings for the model the replicas describe). `inferd serve --ray` and the builder for
`serve run` (inferd/commands/serve_ray.py) pass the same ones `inferd serve` is made of.
"""

from __future__ import annotations

from collections.abc import Callable

from ray import serve
from ray.serve.schema import LoggingConfig

from inferd.ray_serve.ingress import Ingress
from inferd.ray_serve.options import RayOptions
from inferd.ray_serve.replica import EngineReplica, ReplicaEngine
from inferd.ray_serve.wire import ReplicaDescription
from inferd.server.app import ServerSettings

INGRESS = "InferdIngress"
ENGINE = "InferdEngine"
APP_NAME = "inferd"
# The ingress takes every HTTP request; inferd's admission (server/http/admission.py) bounds them.
INGRESS_MAX_ONGOING = 4096
# No Serve access line per handle call (two reports a second); inferd's own access log stays.
_QUIET = LoggingConfig(enable_access_log=False)


def build_application(
    make_engine: Callable[[], ReplicaEngine],
    make_settings: Callable[[ReplicaDescription], ServerSettings],
    options: RayOptions,
) -> serve.Application:
    """The application, ready for `serve.run` (or returned by an application builder)."""
    scale = ({"autoscaling_config": options.autoscaling} if options.autoscaling
             else {"num_replicas": options.num_replicas})  # fmt: skip
    spread = ({"max_replicas_per_node": options.max_replicas_per_node}
              if options.max_replicas_per_node else {})  # fmt: skip
    engine = serve.deployment(
        name=ENGINE,
        ray_actor_options={"num_cpus": options.replica_cpus, "num_gpus": options.replica_gpus},
        max_ongoing_requests=options.max_ongoing_requests,
        request_router_config=options.router_config(),
        graceful_shutdown_timeout_s=options.shutdown_timeout_s,
        health_check_period_s=5.0,
        logging_config=_QUIET,
        **scale,
        **spread,
    )(EngineReplica)
    ingress = serve.deployment(
        name=INGRESS,
        num_replicas=1,  # NOTE: the replicas report to it; one ingress sees every replica
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=INGRESS_MAX_ONGOING,
        graceful_shutdown_timeout_s=options.shutdown_timeout_s,
        logging_config=_QUIET,
    )(Ingress)
    stale_after_s = 5 * options.report_interval_s
    return ingress.bind(engine.bind(make_engine, INGRESS, options.report_interval_s),
                        make_settings, stale_after_s)  # fmt: skip

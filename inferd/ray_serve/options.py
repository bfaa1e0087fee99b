"""How the engine replicas are deployed: the `--ray` flags as one checked value. Imports no Ray
at module level, so that `inferd serve --help` and flag checks work without the extra."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# inferd's router on its KV block hashes (router.py), Ray's on prompt text, and Serve's default.
# NOTE: Ray's public name for its router, ray.serve.llm.request_router.PrefixCacheAffinityRouter,
# is a bare subclass of the class below, but importing ray.serve.llm needs pyarrow (ray[llm],
# which pulls vLLM); the class itself needs only ray[serve], which the `ray` extra pins exactly.
ROUTERS = {
    "prefix": "inferd.ray_serve.router.BlockPrefixRouter",
    "ray-prefix": "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router"
    ".PrefixCacheAffinityRouter",
    "pow2": None,
}
DEFAULT_ROUTER = "prefix"


@dataclass(frozen=True)
class RayOptions:
    """How the engines are deployed. Field names are the flags' (`--num-replicas` ...)."""

    num_replicas: int = 1
    min_replicas: int | None = None  # set either: autoscaling between min and max
    max_replicas: int | None = None
    autoscaling_config: dict[str, Any] = field(default_factory=dict)  # Ray's other fields
    replica_cpus: float = 1.0
    replica_gpus: float = 0.0
    max_replicas_per_node: int | None = None
    max_ongoing_requests: int = 64  # per replica; more wait in the router
    request_router: str = DEFAULT_ROUTER
    router_imbalance: int = 8  # prefix routers: how much busier the holder may be
    block_size: int = 16  # the engines' KV block size (inferd's router hashes blocks)
    shutdown_timeout_s: float = 20.0  # requests in flight may finish, on a redeploy or delete
    report_interval_s: float = 1.0

    def __post_init__(self) -> None:
        def need(ok: bool, flag: str, what: str) -> None:
            if not ok:
                raise ValueError(f"--{flag.replace('_', '-')} {what}")

        need(self.num_replicas >= 1, "num_replicas", f"must be >= 1, got {self.num_replicas}")
        # NOTE: the ingress learns the model from a replica; with none it could answer nothing.
        need(
            self.min_replicas is None or self.min_replicas >= 1,
            "min_replicas",
            f"must be >= 1 (the ingress needs a replica), got {self.min_replicas}",
        )
        low, high = self.replica_range
        need(high >= low, "max_replicas", f"({high}) must be >= --min-replicas ({low})")
        need(self.replica_cpus >= 0, "replica_cpus", f"must be >= 0, got {self.replica_cpus}")
        need(self.replica_gpus >= 0, "replica_gpus", f"must be >= 0, got {self.replica_gpus}")
        need(self.max_ongoing_requests >= 1, "max_ongoing_requests", "must be >= 1")
        need(
            self.request_router in ROUTERS,
            "request_router",
            f"must be one of {', '.join(ROUTERS)}, got {self.request_router!r}",
        )
        need(self.router_imbalance >= 0, "router_imbalance", "must be >= 0")
        reserved = {"min_replicas", "max_replicas"} & self.autoscaling_config.keys()
        need(
            not reserved,
            "autoscaling_config",
            f"must not set {sorted(reserved)}: use --min-replicas/--max-replicas",
        )
        if self.autoscaling:
            self._check_autoscaling()

    def _check_autoscaling(self) -> None:
        """Serve's own check of the fields. Without Ray nothing deploys (the command says so
        before it gets here), so there is nothing to check."""
        try:
            from ray.serve.config import AutoscalingConfig
        except ImportError:
            return
        try:
            AutoscalingConfig(**self.autoscaling)
        except Exception as e:  # noqa: BLE001 - pydantic's message names the field
            raise ValueError(f"--autoscaling-config: {e}") from e

    @property
    def replica_range(self) -> tuple[int, int]:
        low = self.min_replicas if self.min_replicas is not None else 1
        high = self.max_replicas if self.max_replicas is not None else max(low, self.num_replicas)
        return low, high

    @property
    def autoscaling(self) -> dict[str, Any] | None:
        if self.min_replicas is None and self.max_replicas is None:
            return None
        low, high = self.replica_range
        return {**self.autoscaling_config, "min_replicas": low, "max_replicas": high}

    def router_config(self) -> Any:
        """Serve's RequestRouterConfig for the engine deployment."""
        from ray.serve.config import RequestRouterConfig

        path = ROUTERS[self.request_router]
        if path is None:
            return RequestRouterConfig()
        if self.request_router == "prefix":
            kwargs = {"block_size": self.block_size, "imbalance": self.router_imbalance}
        else:
            kwargs = {"imbalanced_threshold": self.router_imbalance}
        return RequestRouterConfig(request_router_class=path, request_router_kwargs=kwargs,
                                   request_routing_stats_period_s=2.0)  # fmt: skip

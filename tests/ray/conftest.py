"""The Ray tests run when the `ray` extra is installed (`pip install -e ".[test,ray]"`); those
that need a cluster share one per module: two Ray nodes on loopback (two logical CPUs each), one
Serve HTTP proxy, stopped at the end with every Ray process gone (checked)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from ray_helpers import free_port, ray_processes, stop_leftovers

_FAST_AUTOSCALING = {"RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.5",
                     "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.5"}  # fmt: skip


@pytest.fixture(scope="module")
def ray_cluster():
    pytest.importorskip("ray.serve")
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no network here
    # Serve's autoscaling metrics every half second (default 10 s), so that the autoscaling test
    # sees load and idleness in seconds. The cluster's processes inherit them.
    saved = {k: os.environ.get(k) for k in _FAST_AUTOSCALING}
    os.environ.update(_FAST_AUTOSCALING)
    before = ray_processes()
    store = 80 << 20  # the object store holds nothing big here
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False, "object_store_memory": store})  # fmt: skip
    try:
        cluster.add_node(num_cpus=2, object_store_memory=store)
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        port = free_port()
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
        yield SimpleNamespace(url=f"http://127.0.0.1:{port}", cluster=cluster)
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            cluster.shutdown()
            for k, v in saved.items():
                if v is None:
                    del os.environ[k]
                else:
                    os.environ[k] = v
    left = stop_leftovers(before)
    assert not left, f"Ray processes outlived the cluster (killed now): {left}"

"""The ingress deployment: `inferd serve`'s own FastAPI app (inferd/server/app.py: every route,
validation, template, tool and stream) built on a `RayEngineClient` instead of an in-process
engine. Serve's HTTP proxy hands it the requests; it tokenizes, renders, admits, and streams, and
the engine replicas only generate.

It learns the model from one replica (`describe`: model info, tokenizer, engine facts) before
it builds the app, so it starts once the first replica has loaded the model. Replicas push
their reports to `report`.
"""

from __future__ import annotations

from collections.abc import Callable

from ray import serve
from ray.serve.handle import DeploymentHandle

from inferd.ray_serve.client import RayEngineClient
from inferd.ray_serve.replica_board import ReplicaBoard
from inferd.ray_serve.wire import ReplicaDescription, ReplicaReport
from inferd.server.app import ServerSettings, create_app


@serve.ingress()
class Ingress:
    async def __init__(
        self,
        engine: DeploymentHandle,
        make_settings: Callable[[ReplicaDescription], ServerSettings],
        stale_after_s: float = 5.0,
    ):
        description: ReplicaDescription = await engine.describe.remote()
        self.settings = make_settings(description)
        name = (self.settings.served_model_names or [description.model_info.name])[0]
        self.board = ReplicaBoard(name, stale_after_s)
        self.board.report(ReplicaReport(description.replica, description.node, None,
                                        description.stats))  # fmt: skip
        self.client = RayEngineClient(engine, description, self.board)

    def __serve_build_asgi_app__(self):
        app = create_app(self.client, self.settings)
        # The replicas' own series and the routing decisions, next to the server's metrics.
        app.state.inferd.metrics.registry.register(self.board)
        return app

    def report(self, report: ReplicaReport) -> None:
        self.board.report(report)

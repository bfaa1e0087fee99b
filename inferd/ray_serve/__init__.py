"""inferd on Ray Serve (the optional extra `pip install -e ".[ray]"`; docs/ray.md).

    app.py            the application: an ingress deployment in front of N engine replicas
    ingress.py        the ingress: `inferd serve`'s FastAPI app over a RayEngineClient
    client.py         RayEngineClient: the EngineClient protocol over Serve deployment handles
    replica.py        an engine replica: one inferd engine client in a Serve replica
    replica_board.py  what the ingress knows of the replicas: health, summed stats, metrics
    router.py         inferd's request router (Serve's interface) on KV block hashes
    prefix_table.py   the block hashes and the routing choice, without Ray
    wire.py           the plain data crossing a handle

`inferd serve --ray` and the application builder for Ray's own tools (`serve run
inferd.commands.serve_ray:build_app ...`) are in inferd/commands/serve_ray.py, which hands this
package the factories `inferd serve` is made of.
"""

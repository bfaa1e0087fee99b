"""Per-request pooling parameters (vLLM's `PoolingParams`) and what a model says about its own
embeddings (`PoolerConfig`).

An embedding request is a prompt with no generation: its prompt is prefilled like any other, and
instead of sampling a token the engine pools the final hidden states (after the model's final
norm) into one vector:

    last   the hidden state of the last prompt token (decoder models' usual choice)
    mean   the mean over every prompt token
    cls    the hidden state of the first token

then keeps its first `dimensions` values (a Matryoshka model only) and scales it to unit length
(`normalize`, on by default as in vLLM). What a request leaves unset comes from the model
(`PoolerConfig`, read from its files by inferd/loader/pooler_config.py).

Everything a client can get wrong raises `InvalidRequest` naming the parameter. The module is
torch-free: the server checks requests with it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from numbers import Integral
from typing import Any

from inferd.errors import InvalidRequest

POOLING_TYPES = ("last", "mean", "cls")


def _pooling_type(value: Any, param: str) -> str:
    """A pooling type by name, in any case (vLLM writes them "LAST", "MEAN", "CLS")."""
    name = value.lower() if isinstance(value, str) else None
    if name not in POOLING_TYPES:
        raise InvalidRequest(param, f"{param} must be one of {', '.join(POOLING_TYPES)}, "
                                    f"got {value!r}")  # fmt: skip
    return name


@dataclass(frozen=True)
class PoolerConfig:
    """How a model's embeddings are made, and which truncations it was trained for."""

    hidden_size: int  # the length of a full embedding
    pooling_type: str = "last"
    normalize: bool = True
    # Matryoshka models (trained so that a prefix of the embedding is an embedding): any length
    # up to hidden_size (`is_matryoshka`), or only these (`matryoshka_dimensions`).
    is_matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] = ()
    source: str = "the default for decoder models"  # where the defaults came from (logs, errors)
    # Why this model's embeddings cannot be computed as its files describe them (a
    # sentence-transformers module inferd does not implement); None: they can.
    unsupported: str | None = None

    def describe(self) -> str:
        """One line for the start-up log: how embeddings are made, and why so."""
        if self.unsupported is not None:
            return f"refused: {self.unsupported}"
        cut = ""
        if self.matryoshka_dimensions:
            cut = f", dimensions {', '.join(map(str, self.matryoshka_dimensions))} allowed"
        elif self.is_matryoshka:
            cut = f", any dimensions up to {self.hidden_size}"
        norm = "normalised" if self.normalize else "not normalised"
        return f"{self.pooling_type} pooling, {norm}{cut} ({self.source})"

    def allows(self, dimensions: int) -> bool:
        if dimensions == self.hidden_size:  # nothing is cut
            return True
        if self.matryoshka_dimensions:
            return dimensions in self.matryoshka_dimensions
        return self.is_matryoshka and 1 <= dimensions < self.hidden_size


@dataclass
class PoolingParams:
    """What one embedding request asks for; None: the model's default (`resolve`)."""

    pooling_type: str | None = None  # "last", "mean" or "cls"
    normalize: bool | None = None  # scale to unit length (L2), after any truncation
    dimensions: int | None = None  # keep the first k values (Matryoshka models only)

    def __post_init__(self) -> None:
        if self.pooling_type is not None:
            self.pooling_type = _pooling_type(self.pooling_type, "pooling_type")
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise InvalidRequest("normalize", f"normalize must be true, false or None, got "
                                              f"{self.normalize!r}")  # fmt: skip
        dims = self.dimensions
        if dims is not None and (not isinstance(dims, Integral) or isinstance(dims, bool)
                                 or dims < 1):  # fmt: skip
            raise InvalidRequest("dimensions", f"dimensions must be a positive integer, got "
                                               f"{dims!r}")  # fmt: skip

    def resolve(self, model: PoolerConfig | None) -> PoolingParams:
        """Every field set, from the model where the request left it open; raises
        InvalidRequest when the model cannot embed or cannot give these `dimensions`."""
        if model is None:
            raise InvalidRequest(None, "this engine does not compute embeddings")
        if model.unsupported is not None:
            raise InvalidRequest(None, f"this model's embeddings cannot be computed: "
                                       f"{model.unsupported}")  # fmt: skip
        dims = self.dimensions
        if dims is not None and not model.allows(dims):
            if model.matryoshka_dimensions:
                allowed = ", ".join(map(str, model.matryoshka_dimensions))
                why = f"this model allows {allowed} or {model.hidden_size}"
            elif model.is_matryoshka:
                why = f"this model's embeddings have {model.hidden_size} values"
            else:
                why = (f"this model was not trained for shorter embeddings (no Matryoshka "
                       f"dimensions in its files or --pooler-config), so only its full size "
                       f"{model.hidden_size} is allowed")  # fmt: skip
            raise InvalidRequest("dimensions", f"dimensions {dims} is not supported: {why}")
        return dataclasses.replace(
            self,
            pooling_type=self.pooling_type or model.pooling_type,
            normalize=model.normalize if self.normalize is None else self.normalize,
        )


def pooler_overrides(value: Any) -> dict[str, Any]:
    """EngineConfig.pooler_config (`--pooler-config`, a JSON object or a dict) checked: the
    fields of the model's PoolerConfig an operator may set. Raises ValueError naming a bad
    key or value."""
    import json

    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ValueError(f"--pooler-config is not JSON: {e}") from e
    if not isinstance(value, dict):
        raise ValueError(f"--pooler-config must be a JSON object, got {value!r}")
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key == "pooling_type":
            out[key] = _pooling_type(item, "--pooler-config pooling_type")
        elif key in ("normalize", "is_matryoshka"):
            if not isinstance(item, bool):
                raise ValueError(f"--pooler-config {key} must be true or false, got {item!r}")
            out[key] = item
        elif key == "matryoshka_dimensions":
            if (
                not isinstance(item, list)
                or not item
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in item)
            ):
                raise ValueError("--pooler-config matryoshka_dimensions must be a non-empty "
                                 f"list of positive integers, got {item!r}")  # fmt: skip
            out[key] = tuple(item)
        else:
            raise ValueError(f"--pooler-config: unknown key {key!r} (known: pooling_type, "
                             "normalize, is_matryoshka, matryoshka_dimensions)")  # fmt: skip
    return out

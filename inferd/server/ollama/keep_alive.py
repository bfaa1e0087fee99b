"""Ollama's `keep_alive`: how long the model stays loaded after a request. Values are Ollama's:
a number of seconds, or a Go duration string ("5m", "1h30m", "-1", "0s"); 0 unloads the model
right after the request, a negative value keeps it loaded for good.

A server of several models (`--model NAME=PATH ...`) honours it: its dispatcher reads it before
the model's app sees the request (server/multimodel/keep_alive.py). A single-model server loads
its one model when it starts and keeps it until it stops, so a value that asks to keep the
model (a duration, or a negative value) is met, and one that asks to unload it (0) is a 400
that says how to serve models that can unload.
"""

from __future__ import annotations

import re

from inferd.errors import InvalidRequest

_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def seconds(value: str | int | float) -> float:
    """`value` in seconds (InvalidRequest naming keep_alive when it is not a duration)."""
    if isinstance(value, bool):
        raise InvalidRequest("keep_alive", f"keep_alive must be a duration, got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    text = value.strip()
    try:
        return float(text)  # Ollama takes a bare number as seconds
    except ValueError:
        pass
    sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.lstrip("+"))
    parts = _PART.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise InvalidRequest(
            "keep_alive",
            f"keep_alive must be a number of seconds or a duration such as '5m' or '1h', "
            f"got {value!r}",
        )
    return sign * sum(float(n) * _UNIT_S[u] for n, u in parts)


def check_keep_alive(value: str | int | float | None) -> None:
    """A single-model server's check (see above)."""
    if value is None or seconds(value) != 0:
        return
    raise InvalidRequest(
        "keep_alive",
        "keep_alive: 0 asks to unload the model, which this server cannot do: it serves one "
        "model, loaded until the server stops (any other keep_alive is met); to load and "
        "unload models on request, start the server with --model NAME=PATH (one or more)",
    )

"""Errors a user can cause. The CLI prints their message (no traceback) and exits non-zero;
the server maps ValueError to HTTP 400."""

from __future__ import annotations


class ModelLoadError(ValueError):
    """The model path, file or checkpoint cannot be used: missing, malformed, unsupported."""


class EngineDeadError(RuntimeError):
    """The engine cannot run any more steps (e.g. a tensor-parallel worker died); every request
    in flight has failed and new ones are refused."""

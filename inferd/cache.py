"""Where inferd keeps what it builds once and reuses: assembled models, converted weights,
tokenizers, compiled kernels. One function, so every package asks the same place."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """`$INFERD_CACHE`, else `$XDG_CACHE_HOME/inferd`, else `~/.cache/inferd`."""
    if os.environ.get("INFERD_CACHE"):
        return Path(os.environ["INFERD_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "inferd"

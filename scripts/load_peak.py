"""Peak resident memory of a model's first load (its blocks packed and written to an empty weight
cache) and of its cached load (the entry mapped), each in a fresh process running
`inferd generate` for a few tokens, and the cache entry's size on disk.

    python scripts/load_peak.py /data/models/qwen2.5-1.5b-Q4_K_M.gguf ...

The compiled kernels are shared with the usual cache (so compiling them is not part of a first
load); the weight cache is a temporary folder. Peak RSS is the child's ru_maxrss (Linux: KiB),
(from os.wait4, per process), which counts the file's and the entry's mapped pages a process
touched, as `ps` does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def run(model: Path, cache: Path, tokens: int) -> float:
    """Peak RSS in GiB of one `inferd generate` in a new process (its own rusage, os.wait4)."""
    env = {**os.environ, "INFERD_CACHE": str(cache)}
    command = [sys.executable, "-m", "inferd", "generate", "t5 t6 t7", "--model", str(model),
               "--max-tokens", str(tokens), "--quiet"]  # fmt: skip
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"{model.name}: inferd generate failed:\n{stderr[-2000:].decode()}")
    return usage.ru_maxrss / 2**20


def measure(model: Path, tokens: int) -> None:
    from inferd.cache import cache_dir

    with tempfile.TemporaryDirectory(prefix="inferd-load-") as tmp:
        cache = Path(tmp)
        kernels = cache_dir() / "kernels"
        if kernels.is_dir():
            (cache / "kernels").symlink_to(kernels)
        first = run(model, cache, tokens)
        entry = sum(p.stat().st_size for p in (cache / "weights").glob("*.safetensors"))
        cached = run(model, cache, tokens)
        size = model.stat().st_size
        print(f"{model.name}: file {size / 2**30:.2f} GiB; first load peak RSS {first:.2f} GiB "
              f"({first / (size / 2**30):.2f}x the file); cached load peak RSS {cached:.2f} GiB "
              f"({cached / (size / 2**30):.2f}x); cache entry {entry / 2**30:.2f} GiB "
              f"({entry / size:.2f}x)", flush=True)  # fmt: skip
        shutil.rmtree(cache / "weights", ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--tokens", type=int, default=4, help="tokens generated (default 4)")
    args = ap.parse_args()
    for model in args.models:
        measure(model, args.tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())

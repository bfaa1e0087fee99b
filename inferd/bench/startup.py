"""Start-up: seconds from launching a fresh process to its first generated token.

inferd is timed as a user meets it, `python -m inferd generate ... --max-tokens 1`; the clock
stops at the first byte on its stdout, which `generate` writes once the first token is decoded
(or, for a token with no text, right after it with the closing newline). llama.cpp is timed the
same way: a fresh interpreter imports llama_cpp, loads the GGUF, generates one token and writes a
byte. Both pay for interpreter start and imports.

Warm runs: caches filled by one untimed run each first; runs alternate between the systems, so
background load on a shared machine hits both alike. Python's own cache counts among them: the
runs go without PYTHONDONTWRITEBYTECODE (some sandboxes set it), since with it every start
compiles the modules of an editable install again from source (~0.1 s for inferd's), which
no default installation does. Cold runs (inferd only): each in a fresh,
empty INFERD_CACHE, so it pays for everything a first run does (assembling the embedded model,
building the tokenizer, converting and caching weights, compiling kernels); a pulled model is
linked into that cache, since downloading is `inferd pull`'s time, not start-up's. The operating
system's file cache stays as it is (dropping it needs root and slows every other process).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

_LLAMA_CPP_FIRST_TOKEN = """\
import sys
import llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=512, n_threads=int(sys.argv[2]), verbose=False)
next(llm.generate(llm.tokenize(b"Hello"), temp=0.0))
sys.stdout.write("x")
sys.stdout.flush()
"""


@dataclass
class StartupResult:
    system: str
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)  # user + system, whole run
    command: str = ""
    cache: str = "warm"  # or "cold": a fresh, empty INFERD_CACHE per run

    @property
    def median(self) -> float:
        return float(np.median(self.seconds))

    @property
    def cpu_median(self) -> float:
        return float(np.median(self.cpu_seconds))

    def to_dict(self) -> dict:
        return {
            "system": self.system,
            "median_s": self.median,
            "min_s": min(self.seconds),
            "max_s": max(self.seconds),
            "runs_s": self.seconds,
            "cpu_median_s": self.cpu_median if self.cpu_seconds else None,
            "cpu_runs_s": self.cpu_seconds,
            "command": self.command,
            "cache": self.cache,
        }


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_to_first_byte(cmd: Sequence[str], timeout: float = 600.0,
                       env: dict[str, str] | None = None) -> float:  # fmt: skip
    """Seconds from spawning `cmd` to the first byte on its stdout; the process must exit 0."""
    return timed_run(cmd, timeout, env)[0]


def timed_run(cmd: Sequence[str], timeout: float = 600.0,
              env: dict[str, str] | None = None) -> tuple[float, float]:  # fmt: skip
    """(seconds to the first byte on stdout, CPU seconds of the whole run, children included).
    NOTE: the CPU figure is the less noisy one on a shared machine: waiting for a core does
    not count, although cache misses from neighbours still do."""
    cpu_before = _children_cpu()
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=err, env=env)
        first = proc.stdout.read(1)
        elapsed = time.perf_counter() - t0
        proc.stdout.read()
        proc.stdout.close()
        code = proc.wait(timeout)
        if code != 0 or not first:
            err.seek(0)
            tail = err.read().decode(errors="replace").strip().splitlines()[-5:]
            raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {code}: " + " | ".join(tail))
    return elapsed, _children_cpu() - cpu_before


def inferd_command(engine_flags: Sequence[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "inferd",
        "generate",
        "Hello",
        "--max-tokens",
        "1",
        "--ignore-eos",
        "--quiet",
        *engine_flags,
    ]


def llama_cpp_command(model_path: str, threads: int | None = None) -> list[str]:
    threads = threads or os.cpu_count() or 1
    return [sys.executable, "-c", _LLAMA_CPP_FIRST_TOKEN, str(model_path), str(threads)]


def warm_environment() -> dict[str, str]:
    """This process's environment, with Python's bytecode cache allowed (module docstring)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run_startup(commands: dict[str, list[str]], num_runs: int) -> list[StartupResult]:
    """`commands`: system name → command line. One warm-up run each, then `num_runs` rounds."""
    if num_runs < 1:
        raise ValueError(f"--num-runs must be >= 1, got {num_runs}")
    results = {name: StartupResult(name, command=" ".join(cmd)) for name, cmd in commands.items()}
    env = warm_environment()
    for cmd in commands.values():
        time_to_first_byte(cmd, env=env)
    for _ in range(num_runs):
        for name, cmd in commands.items():
            elapsed, cpu = timed_run(cmd, env=env)
            results[name].seconds.append(elapsed)
            results[name].cpu_seconds.append(cpu)
    return list(results.values())


def run_cold(
    name: str, cmd: list[str], num_runs: int, pulled: Sequence[Path] = ()
) -> StartupResult:
    """`num_runs` runs of `cmd`, each with a fresh empty INFERD_CACHE (removed afterwards) that
    holds only links to the `pulled` model files and their stamps."""
    if num_runs < 1:
        raise ValueError(f"--cold-runs must be >= 1, got {num_runs}")
    result = StartupResult(name, command=" ".join(cmd), cache="cold")
    for _ in range(num_runs):
        with tempfile.TemporaryDirectory(prefix="inferd-cold-") as cache:
            models = Path(cache) / "models"
            models.mkdir()
            for path in pulled:
                for src in (path, path.with_suffix(".verified.json")):
                    (models / src.name).symlink_to(src.resolve())
            env = {**os.environ, "INFERD_CACHE": cache}
            elapsed, cpu = timed_run(cmd, env=env)
            result.seconds.append(elapsed)
            result.cpu_seconds.append(cpu)
    return result

"""llama.cpp's own benchmark program as a peer (`--compare llama-bench`): the engine's speed
without the Python bindings' per-token overhead, which flatters a ratio against
`llama-cpp-python`.

Each request is one run of `llama-bench` on the same GGUF file with the same threads: a
prefill of the request's prompt length (`pp`) and a decode of its output length (`tg`, from an
empty cache), one repetition after llama-bench's own warm-up run. Its timing is built from the
two durations llama-bench reports: the first token when the prefill ends (a prefill yields the
first token's logits), the last after (output - 1) / output of the decode's duration (the first
token came from the prefill). One request at a time: llama-bench runs no concurrent
sequences, so it takes part in `bench latency` with a batch of one only. The process start and
the model's load (and llama.cpp's repacking of some types) are not part of the timing: an
iteration's duration, whence its throughputs, is the span of the request's timing.

The program is `--llama-bench PATH`, else `$INFERD_LLAMA_BENCH`, else `llama-bench` on PATH
(docs/benchmarks.md says how to build it from the llama-cpp-python sdist).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Sequence

from inferd.bench.metrics import RequestTiming
from inferd.bench.peer_unavailable import PeerUnavailable
from inferd.bench.workload import BenchRequest


def find_program(path: str | None) -> str:
    """The llama-bench to run; PeerUnavailable naming what was looked for when there is none."""
    candidate = path or os.environ.get("INFERD_LLAMA_BENCH") or shutil.which("llama-bench")
    if not candidate or not os.access(candidate, os.X_OK):
        raise PeerUnavailable(
            f"llama-bench peer skipped: no llama-bench program ({candidate or 'none on PATH'}); "
            "give --llama-bench PATH or set INFERD_LLAMA_BENCH (docs/benchmarks.md builds it)"
        )
    return candidate


def parse_report(text: str) -> dict[str, float]:
    """llama-bench's JSON report → {"pp": seconds, "tg": seconds} (the mean of its samples for
    each test it ran). Raises ValueError when the report is not one."""
    try:
        tests = json.loads(text)
        out = {}
        for test in tests:
            kind = "pp" if int(test["n_gen"]) == 0 else "tg"
            out[kind] = float(test["avg_ns"]) / 1e9
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"llama-bench printed no report it could be read from: {e}") from e
    return out


def request_timing(r: BenchRequest, start: float, seconds: dict[str, float]) -> RequestTiming:
    """The request's timing from llama-bench's durations (see the module's docstring)."""
    first = start + seconds["pp"]
    decode = seconds.get("tg", 0.0) * (r.output_len - 1) / r.output_len if r.output_len else 0
    return RequestTiming(start, first, first + decode, r.prompt_len, r.output_len)


class LlamaBenchSystem:
    name = "llama-bench"
    times_itself = True  # an iteration lasts what its timings span (bench/latency.py)

    def __init__(self, model_path: str, *, threads: int | None, program: str | None = None):
        self.program = find_program(program)
        self.model_path = str(model_path)
        self.threads = threads or os.cpu_count() or 1
        self.load_seconds = 0.0  # each run loads the model itself, outside its timings
        try:
            version = subprocess.run([self.program, "--version"], capture_output=True,
                                     text=True, timeout=60).stderr.strip().splitlines()  # fmt: skip
        except (OSError, subprocess.SubprocessError) as e:
            raise PeerUnavailable(f"llama-bench peer skipped: {self.program}: {e}") from e
        self.info = {
            "version": version[0] if version else "unknown",
            "threads": str(self.threads),
            "batching": "none: one llama-bench run (pp, then tg from an empty cache) a request",
        }

    def generate(self, requests: Sequence[BenchRequest]) -> list[RequestTiming]:
        if len(requests) != 1:
            raise ValueError("llama-bench runs one sequence at a time: compare it with a batch "
                             "of one (bench latency --num-prompts 1, or --preset single / "
                             "prefill512)")  # fmt: skip
        (r,) = requests
        start = time.perf_counter()
        return [request_timing(r, start, self._run(r.prompt_len, r.output_len))]

    def _run(self, prompt: int, output: int) -> dict[str, float]:
        command = [self.program, "-m", self.model_path, "-t", str(self.threads), "-r", "1",
                   "-p", str(prompt), "-n", str(output), "-o", "json"]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise RuntimeError(f"llama-bench failed ({done.returncode}): {done.stderr[-500:]}")
        seconds = parse_report(done.stdout)
        if "pp" not in seconds:
            raise RuntimeError("llama-bench reported no prefill test")
        return seconds

    def close(self) -> None:
        pass

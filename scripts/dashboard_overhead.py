"""Does watching cost the engine anything? `throughput32` over HTTP against one `inferd serve`,
alternately with and without a dashboard connected (an event stream at the fastest rate the
server allows, 4 snapshots a second), and /metrics compared between the two (issue 30's "Must
show"). Both arms run in one process against one server, alternating (ABBA), so a busy spell on
a shared machine lands on both; the verdict compares the arms' gap with the run-to-run spread.

    python scripts/dashboard_overhead.py                    # starts its own server
    python scripts/dashboard_overhead.py --rounds 4 --threads 2
    python scripts/dashboard_overhead.py --base-url http://127.0.0.1:8000   # one you started
    python scripts/dashboard_overhead.py --num-prompts 8   # a quick look: 8 of its 32 requests

The server it starts runs without prefix caching, so every run computes the same workload
(the same prompts each time); start yours with --no-enable-prefix-caching for the same reason.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

import httpx

from inferd.bench.presets import resolve_workload
from inferd.bench.serve import run_serve
from inferd.bench.workload import make_requests, workload_vocab
from inferd.loader import open_checkpoint
from inferd.tokenizer import checkpoint_tokenizer


class Watcher:
    """A dashboard's event stream, read in a thread until stopped; counts the snapshots."""

    def __init__(self, base_url: str, interval: float):
        self.url = f"{base_url}/dashboard/events?interval={interval}"
        self.events = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with httpx.stream("GET", self.url, timeout=None) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: "):
                    self.events += 1
                if self._stop.is_set():
                    return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(10)
        return self.events


def metric_values(base_url: str) -> dict[str, float]:
    """Every sample of /metrics, by its line's name and labels."""
    out = {}
    for line in httpx.get(base_url + "/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def generated(before: dict[str, float], after: dict[str, float]) -> float:
    key = next(k for k in after if k.startswith("inferd:generation_tokens_total"))
    return after[key] - before.get(key, 0.0)


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of a process so far (Linux), None when unknown."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(port: int, threads: int | None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "inferd", "serve", "--port", str(port), "--quiet",
           "--no-enable-prefix-caching", "--disable-log-requests"]  # fmt: skip
    if threads:
        cmd += ["--threads", str(threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"inferd serve exited with {proc.returncode}")
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit("inferd serve did not become healthy in 300 s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--base-url", help="a running server (default: start one)")
    p.add_argument("--port", type=int, default=8123, help="port of the server started (8123)")
    p.add_argument("--threads", type=int, help="--threads of the server started (default: torch's)")
    p.add_argument("--rounds", type=int, default=2, help="ABBA rounds: 4 runs each (default 2)")
    p.add_argument("--interval", type=float, default=0.25, help="the dashboard's event interval")
    p.add_argument("--num-prompts", type=int, default=32,
                   help="the first N requests of throughput32 (default: all 32)")  # fmt: skip
    args = p.parse_args()
    proc = None if args.base_url else start_server(args.port, args.threads)
    base = args.base_url or f"http://127.0.0.1:{args.port}"
    try:
        tokenizer = checkpoint_tokenizer(open_checkpoint(None))
        spec = resolve_workload("throughput32", input_len=None, output_len=None, range_ratio=0.0,
                                num_prompts=None, seed=0, default_prompts=32)  # fmt: skip
        requests = make_requests(spec, workload_vocab(tokenizer), tokenizer)[: args.num_prompts]
        run_serve(base, requests[:4])  # warm-up: first-use costs land in no arm
        runs: dict[str, list[float]] = {"without": [], "with": []}
        names_seen: dict[str, set[str]] = {"without": set(), "with": set()}
        tokens: dict[str, list[float]] = {"without": [], "with": []}
        used: dict[str, list[float]] = {"without": [], "with": []}  # server CPU seconds a run
        order = ["without", "with", "with", "without"] * args.rounds
        for i, arm in enumerate(order):
            before = metric_values(base)
            cpu_before = cpu_seconds(proc.pid if proc else None)
            watcher = Watcher(base, args.interval) if arm == "with" else None
            result = run_serve(base, requests)
            events = watcher.stop() if watcher else 0
            after = metric_values(base)
            cpu_after = cpu_seconds(proc.pid if proc else None)
            rate = result.metrics.output_throughput
            runs[arm].append(rate)
            tokens[arm].append(generated(before, after))
            names_seen[arm] |= {k.split("{")[0] for k in after}
            cpu = ""
            if cpu_before is not None:
                used[arm].append(cpu_after - cpu_before)
                cpu = f", server CPU {used[arm][-1]:.1f} s"
            print(
                f"run {i + 1:2d} {arm:>7} dashboard: {rate:7.1f} output tok/s over "
                f"{result.metrics.duration:5.1f} s, {events} snapshots received, "
                f"{tokens[arm][-1]:.0f} tokens counted by /metrics{cpu}",
                flush=True,
            )
        med = {arm: statistics.median(v) for arm, v in runs.items()}
        spread = max(max(v) / min(v) - 1 for v in runs.values())
        ratio = med["with"] / med["without"]
        print(
            f"median output tok/s: without {med['without']:.1f}, with {med['with']:.1f}; "
            f"with/without {ratio:.3f}; largest run-to-run spread within an arm "
            f"{100 * spread:.1f}%"
        )
        verdict = "within noise" if abs(ratio - 1) <= spread else "outside the noise"
        print(f"verdict: the dashboard's effect on throughput is {verdict}")
        if used["with"] and used["without"]:
            # The same tokens each run: CPU time is the steadier measure on a shared machine.
            cpu = {arm: statistics.median(v) for arm, v in used.items()}
            print(
                f"median server CPU seconds a run: without {cpu['without']:.2f}, with "
                f"{cpu['with']:.2f} (with/without {cpu['with'] / cpu['without']:.3f})"
            )
        same_names = names_seen["with"] == names_seen["without"]
        same_tokens = set(tokens["with"]) == set(tokens["without"])
        print(
            f"/metrics: the same series with and without a dashboard: {same_names}; "
            f"generation tokens counted per run identical: {same_tokens}"
        )
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()

"""Presenting results: a rich table (one column per system, then inferd/peer ratios), the JSON
document, and an optional PNG of throughput and latency percentiles."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from inferd.bench.efficiency import TABLE_ROWS, efficiency_lines
from inferd.bench.metrics import Stats, SystemResult
from inferd.bench.startup import StartupResult

# Ratios are always first system / peer. For throughputs > 1 means the first system is faster;
# for latencies < 1 does, hence the direction printed next to each.
HIGHER, LOWER = "higher is better", "lower is better"
RATIO_METRICS: dict[str, tuple[Callable[[SystemResult], float | None], str]] = {
    "output tok/s": (lambda r: r.metrics.output_throughput, HIGHER),
    "output tok/s, median iteration": (lambda r: r.iteration_output_throughput, HIGHER),
    "median TTFT": (lambda r: r.metrics.ttft.median if r.metrics.ttft else None, LOWER),
    "prefill tok/s": (lambda r: r.prefill_throughput, HIGHER),
}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def comparison_ratios(results: Sequence[SystemResult]) -> dict[str, dict[str, float | None]]:
    """{peer: {metric: first / peer}} for every peer after the first result."""
    base = results[0]
    return {
        peer.system: {
            name: _ratio(get(base), get(peer)) for name, (get, _) in RATIO_METRICS.items()
        }
        for peer in results[1:]
    }


def _stat_rows(name: str, attr: str) -> list[tuple[str, Callable, str | None]]:
    def pick(field: str) -> Callable[[SystemResult], float | None]:
        def get(r: SystemResult) -> float | None:
            s: Stats | None = getattr(r.metrics, attr)
            if s is None:
                return None
            return 1000.0 * (s.p99 if field == "p99" else getattr(s, field))

        return get

    ratio = "median TTFT" if attr == "ttft" else None
    return [
        (f"Mean {name} (ms)", pick("mean"), None),
        (f"Median {name} (ms)", pick("median"), ratio),
        (f"P99 {name} (ms)", pick("p99"), None),
    ]


def _rows() -> list[tuple[str, Callable[[SystemResult], float | None], str | None]]:
    def it(field: str) -> Callable[[SystemResult], float | None]:
        return lambda r: (
            None
            if r.iteration is None
            else (r.iteration.p99 if field == "p99" else getattr(r.iteration, field))
        )

    m = lambda name: lambda r: getattr(r.metrics, name)  # noqa: E731
    return [
        ("Successful requests", m("completed"), None),
        ("Failed requests", lambda r: r.metrics.failed or None, None),
        ("Duration (s)", m("duration"), None),
        ("Request throughput (req/s)", m("request_throughput"), None),
        ("Output token throughput (tok/s)", m("output_throughput"), "output tok/s"),
        (
            "Output tok/s, median iteration",
            lambda r: r.iteration_output_throughput,
            "output tok/s, median iteration",
        ),
        ("Total token throughput (tok/s)", m("total_token_throughput"), None),
        ("Prefill throughput (tok/s)", lambda r: r.prefill_throughput, "prefill tok/s"),
        ("Mean iteration latency (s)", it("mean"), None),
        ("Median iteration latency (s)", it("median"), None),
        ("P99 iteration latency (s)", it("p99"), None),
        *_stat_rows("TTFT", "ttft"),
        *_stat_rows("TPOT", "tpot"),
        *_stat_rows("ITL", "itl"),
        *_stat_rows("E2EL", "e2el"),
        *((label, get, None) for label, get in TABLE_ROWS),  # inferd's steps against the peaks
        ("Load time (s)", lambda r: r.load_seconds, None),
    ]


def _fmt(v: float | int | None) -> str:
    if v is None:
        return "—"
    if isinstance(v, int):
        return str(v)
    return f"{v:.3g}" if abs(v) < 10 else f"{v:,.1f}"


def print_results(
    title: str, results: Sequence[SystemResult], console: Console, skipped: Sequence[str] = ()
) -> None:
    base = results[0].system
    console.print(f"[bold]{escape(title)}[/]")  # not the table's title: that wraps to its width
    table = Table()
    table.add_column("metric")
    for r in results:
        table.add_column(r.system, justify="right")
    for peer in results[1:]:
        table.add_column(f"{base}/{peer.system}", justify="right")
    for label, get, ratio_key in _rows():
        values = [get(r) for r in results]
        if all(v is None for v in values):
            continue
        ratios = [
            _fmt(_ratio(values[0], v)) + "×" if ratio_key and _ratio(values[0], v) else ""
            for v in values[1:]
        ]
        table.add_row(label, *(_fmt(v) for v in values), *ratios)
    console.print(table)
    for r in results:
        details = ", ".join(f"{k} {v}" for k, v in r.info.items())
        console.print(f"  {r.system}: {escape(details)}")
        for note in r.notes:
            console.print(f"  [bold red]{r.system}: {escape(note)}[/]")
        for line in phase_lines(r) + efficiency_lines(r):
            console.print(f"  {escape(line)}")
    for line in skipped:
        console.print(f"  [yellow]{escape(line)}[/]")
    for peer, ratios in comparison_ratios(results).items():
        parts = [
            f"{name} {value:.2f}× ({RATIO_METRICS[name][1]})"
            for name, value in ratios.items()
            if value is not None
        ]
        if parts:
            console.print(f"  [bold]{base} / {peer}[/]: " + "; ".join(parts))


def phase_lines(result: SystemResult) -> list[str]:
    """One line per kind of step: mean step time, each phase's mean and share, and the share
    spent outside the model's forward (the engine's Python overhead)."""

    def ms(seconds: float) -> str:
        return f"{1000 * seconds:.3g} ms" if seconds < 0.1 else f"{1000 * seconds:,.0f} ms"

    lines = []
    for b in result.step_phases:
        phases = ", ".join(
            f"{name} {ms(s)} ({s / b.step_seconds:.1%})" for name, s in b.phase_seconds.items()
        )
        lines.append(
            f"{result.system} {b.kind} steps: {b.steps} of {b.tokens_per_step:.3g} tokens, "
            f"{ms(b.step_seconds)} each = {phases}; outside the forward {b.outside_forward:.1%}"
        )
    return lines


def print_startup(results: Sequence[StartupResult], console: Console) -> None:
    console.print("[bold]Start-up: process launch → first generated token[/]")
    table = Table()
    for col in ("system", "cache", "median (s)", "min (s)", "max (s)", "CPU median (s)", "runs"):
        table.add_column(col, justify="left" if col in ("system", "cache") else "right")
    for r in results:
        table.add_row(
            r.system,
            r.cache,
            f"{r.median:.2f}",
            f"{min(r.seconds):.2f}",
            f"{max(r.seconds):.2f}",
            f"{r.cpu_median:.2f}" if r.cpu_seconds else "-",
            str(len(r.seconds)),
        )
    console.print(table)
    warm = [r for r in results if r.cache == "warm"]
    for peer in warm[1:]:
        ratio = warm[0].median / peer.median
        console.print(
            f"  [bold]{warm[0].system} / {peer.system}[/]: median warm start-up "
            f"{ratio:.2f}× ({LOWER})"
        )


def environment() -> dict:
    """What else was going on: the load average is the tell of a busy shared machine."""
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {"cpu_count": os.cpu_count(), "loadavg": load}


def _plain(value):
    """Strict JSON: inf/nan (an infinite request rate) become strings, not `Infinity`."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def write_json(path: str, document: dict) -> None:
    text = json.dumps(_plain(document), indent=2, default=str, allow_nan=False)
    if path == "-":
        print(text)
    else:
        with open(path, "w") as f:
            f.write(text + "\n")

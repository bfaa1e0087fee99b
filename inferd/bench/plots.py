"""`inferd bench ... --plot FILE.png`: what a run's requests did, one colour per system.

    ┌ output throughput ────────┬ throughput against requests in flight ┐
    ├ time to first token (CDF) ┴ time per output token (CDF; ITL too)  ┘

Throughput against concurrency comes from the run itself: its duration is cut into windows, and
each window gives one point, the mean number of requests in flight in it against the output
tokens per second produced in it (a request's tokens spread evenly between its first and its
last, or at its streamed chunks). A single offline run sweeps concurrency by itself as its
requests finish. matplotlib is an optional extra (`pip install 'inferd[plot]'`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from inferd.bench.metrics import RequestTiming, SystemResult

WINDOWS = 24  # windows a run is cut into for the throughput-concurrency points


def pyplot():
    """matplotlib's pyplot drawing to files only, or a ValueError naming the extra to install."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ValueError("--plot needs matplotlib: pip install 'inferd[plot]'") from e
    return plt


def concurrency_points(timings: Sequence[RequestTiming], windows: int = WINDOWS):
    """(mean requests in flight, output tok/s) per window of the run; windows with neither
    are left out. Requests in flight: sent (or handed over) and not yet ended."""
    ok = [t for t in timings if t.success]
    if not ok:
        return np.zeros(0), np.zeros(0)
    start, end = min(t.start for t in ok), max(t.end for t in ok)
    if end <= start:
        return np.zeros(0), np.zeros(0)
    edges = np.linspace(start, end, windows + 1)
    width = edges[1] - edges[0]
    busy, tokens = np.zeros(windows), np.zeros(windows)
    for t in ok:
        busy += _overlap(edges, t.start, t.end) / width
        if t.chunk_times:  # streamed: each chunk's share of the tokens where it arrived
            share = t.output_tokens / len(t.chunk_times)
            bins = np.clip(np.searchsorted(edges, t.chunk_times, side="right") - 1, 0,
                           windows - 1)  # fmt: skip
            np.add.at(tokens, bins, share)
        elif t.first_token is not None and t.output_tokens:
            first = np.clip(np.searchsorted(edges, t.first_token, side="right") - 1, 0,
                            windows - 1)  # fmt: skip
            tokens[first] += 1
            rest = t.output_tokens - 1
            if rest and t.end > t.first_token:
                tokens += rest * _overlap(edges, t.first_token, t.end) / (t.end - t.first_token)
            elif rest:
                tokens[first] += rest
    keep = (busy > 0) | (tokens > 0)
    return busy[keep], tokens[keep] / width


def _overlap(edges: np.ndarray, a: float, b: float) -> np.ndarray:
    """Seconds of [a, b] inside each window."""
    return np.clip(np.minimum(edges[1:], b) - np.maximum(edges[:-1], a), 0.0, None)


def _cdf(ax, values: list[float], label: str, colour: str, style: str = "-") -> None:
    data = np.sort(np.asarray(values, dtype=float)) * 1000.0
    ax.step(data, np.arange(1, data.size + 1) / data.size, where="post", color=colour,
            linestyle=style, label=label)  # fmt: skip


def _scale(ax) -> None:
    """A log axis where the values span a decade or more; a plain one otherwise."""
    low, high = ax.dataLim.x0, ax.dataLim.x1
    if low > 0 and high / low >= 10:
        ax.set_xscale("log")
        ax.set_xlabel("ms (log scale)")
    else:
        ax.set_xlabel("ms")


def plot_bench(results: Sequence[SystemResult], path: str, title: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (bars, sweep), (ttft, tpot) = axes
    names = [r.system for r in results]
    colours = [f"C{i}" for i in range(len(results))]
    bars.bar(names, [r.metrics.output_throughput for r in results], color=colours)
    for i, r in enumerate(results):
        bars.annotate(f"{r.metrics.output_throughput:,.1f}", (i, r.metrics.output_throughput),
                      ha="center", va="bottom")  # fmt: skip
    bars.set_ylabel("output tokens / s")
    bars.set_title("output throughput (whole run)")
    for r, colour in zip(results, colours, strict=True):
        ok = [t for t in r.timings if t.success]
        busy, rate = concurrency_points(ok)
        if busy.size:
            sweep.scatter(busy, rate, color=colour, label=r.system, s=18)
        ttfts = [t.ttft for t in ok if t.ttft is not None]
        tpots = [t.tpot for t in ok if t.tpot is not None]
        itls = [gap for t in ok for gap in t.itl]
        if ttfts:
            _cdf(ttft, ttfts, r.system, colour)
        if tpots:
            _cdf(tpot, tpots, f"{r.system} TPOT", colour)
        if itls:
            _cdf(tpot, itls, f"{r.system} ITL", colour, "--")
    sweep.set_xlabel(f"requests in flight (mean over each of {WINDOWS} windows of the run)")
    sweep.set_ylabel("output tokens / s in the window")
    sweep.set_title("throughput against concurrency, as the run went")
    sweep.set_xlim(left=0)
    sweep.set_ylim(bottom=0)
    for ax, what in ((ttft, "time to first token"), (tpot, "time per output token")):
        _scale(ax)
        ax.set_ylabel("fraction of requests" if ax is ttft else "fraction of requests / gaps")
        ax.set_title(f"{what}: distribution")
        ax.grid(True, which="both", alpha=0.3)
    for ax in (sweep, ttft, tpot):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

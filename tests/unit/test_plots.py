"""The --plot files: throughput against concurrency read from a run's own timestamps (tokens and
busy time conserved), the bench and memory PNGs, the memory sweeps, and the error naming the
extra when matplotlib is missing."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from test_memory import GEMMA_LIKE

from inferd import cli
from inferd.bench.metrics import RequestTiming, SystemResult, compute_metrics
from inferd.bench.plots import concurrency_points, plot_bench, pyplot
from inferd.commands.memory_plot import COMPONENTS, concurrencies, contexts, plot_memory, sweep
from inferd.memory.estimate import estimate_memory

PNG = b"\x89PNG\r\n\x1a\n"


def staggered(n: int = 8, tokens: int = 50) -> list[RequestTiming]:
    """All sent at 0; request i gets its first token at 1 and ends at 2 + i (as a batch that
    drains: concurrency falls from n to 1)."""
    return [RequestTiming(0.0, 1.0, 2.0 + i, 10, tokens) for i in range(n)]


def test_concurrency_points_conserve_tokens_and_busy_time():
    timings = staggered()
    busy, rate = concurrency_points(timings, windows=9)  # the run lasts 9 s: 1 s windows
    assert rate.sum() * 1.0 == pytest.approx(sum(t.output_tokens for t in timings))
    assert busy.sum() * 1.0 == pytest.approx(sum(t.e2el for t in timings))
    assert busy[0] == pytest.approx(8) and busy[-1] == pytest.approx(1)  # the batch drains
    assert np.all(np.diff(busy) <= 1e-9)


def test_streamed_chunks_put_their_tokens_where_they_arrived():
    t = RequestTiming(0.0, 0.5, 4.0, 10, 4, chunk_times=(0.5, 1.5, 2.5, 3.5))
    busy, rate = concurrency_points([t], windows=4)
    assert list(rate) == [1.0, 1.0, 1.0, 1.0] and list(busy) == [1.0] * 4
    assert concurrency_points([]) [0].size == 0  # fmt: skip


def result(name: str, timings: list[RequestTiming]) -> SystemResult:
    return SystemResult(name, compute_metrics(timings, 9.0), timings=timings)


def test_the_bench_plot_is_a_png(tmp_path):
    streamed = [RequestTiming(0.0, 0.2 + i / 10, 3.0 + i, 8, 6,
                              chunk_times=tuple(0.2 + i / 10 + k * 0.5 for k in range(6)))
                for i in range(4)]  # fmt: skip
    path = tmp_path / "bench.png"
    plot_bench([result("inferd", staggered()), result("server", streamed)], str(path), "test")
    assert path.read_bytes()[:8] == PNG and path.stat().st_size > 20_000


def test_memory_sweeps_grow_the_kv_cache_and_keep_the_weights():
    settings = dict(dtype="bf16", device="cuda")
    base = estimate_memory(GEMMA_LIKE, max_model_len=4096, concurrency=4, **settings)
    by_context, by_concurrency = sweep(GEMMA_LIKE, settings, base)
    assert [s.label for s in by_context] == ["256", "512", "1,024", "2,048", "4,096"]
    assert [s.label for s in by_concurrency] == ["1", "2", "4", "8", "16", "32"]
    for stacks in (by_context, by_concurrency):
        kv = [s.parts["KV cache"] for s in stacks]
        assert kv == sorted(kv) and kv[0] < kv[-1]
        assert len({s.parts["weights"] for s in stacks}) == 1
    # Each bar is the estimate's own total at that point.
    assert by_concurrency[2].total == base.per_device.total
    assert list(by_context[0].parts) == list(COMPONENTS)


def test_context_and_concurrency_ticks():
    assert contexts(8192) == [256, 512, 1024, 2048, 4096, 8192]
    assert contexts(100_000)[-2:] == [65536, 100_000] and len(contexts(100_000)) == 8
    assert concurrencies(1) == [1, 2, 4, 8, 16, 32]
    assert concurrencies(12) == [1, 2, 4, 8, 12, 16, 32]


def test_memory_plot_draws_the_device_line(tmp_path):
    settings = dict(dtype="bf16", device="cuda")
    base = estimate_memory(GEMMA_LIKE, max_model_len=4096, concurrency=4, **settings)
    path = tmp_path / "memory.png"
    plot_memory(str(path), base, GEMMA_LIKE, settings, 2 * base.per_device.total, "a test")
    assert path.read_bytes()[:8] == PNG


def test_inferd_memory_plot_writes_the_file(tmp_path):
    path = tmp_path / "m.png"
    code = cli.main(["memory", "--max-model-len", "2048", "--concurrency", "2", "--device",
                     "cpu", "--plot", str(path), "--quiet"])  # fmt: skip
    assert code == 0 and path.read_bytes()[:8] == PNG


@pytest.mark.parametrize("argv", [["memory", "--plot", "x.png"],
                                  ["bench", "throughput", "--plot", "x.png"]])  # fmt: skip
def test_without_matplotlib_plot_names_the_extra_before_any_work(monkeypatch, capsys, argv):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    with pytest.raises(ValueError, match=r"inferd\[plot\]"):
        pyplot()
    assert cli.main([*argv, "--quiet"]) == 2
    assert "pip install 'inferd[plot]'" in capsys.readouterr().err

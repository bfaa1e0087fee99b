"""`inferd plan --plot FILE.png`: output throughput, TTFT and TPOT p99 against concurrency for
each configuration that fits, with the SLO lines: where a curve crosses its SLO line is the
largest concurrency the table reports."""

from __future__ import annotations

from inferd.plan.planner import Plan
from inferd.plan.predict import operate

MAX_LINES = 6  # the configurations drawn: the best by throughput at the SLOs


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ValueError("--plot needs matplotlib: pip install 'inferd[plot]'") from e
    return plt


def concurrencies(top: int) -> list[int]:
    """1, 2, 4, ... up to `top` (and `top` itself)."""
    out, n = [], 1
    while n < top:
        out.append(n)
        n *= 2
    return out + [max(top, 1)]


def plot_plan(path: str, plan: Plan) -> None:
    plt = _pyplot()
    hw, w = plan.hardware, plan.workload
    ranked = sorted(plan.evaluated, key=lambda e: -(e.best_under_slo or e.at_workload or
                                                   _zero()).output_tok_s)[:MAX_LINES]  # fmt: skip
    fig, (ax_tp, ax_ttft, ax_tpot) = plt.subplots(1, 3, figsize=(16, 5))
    for e in ranked:
        c = e.candidate
        xs = concurrencies(c.max_concurrency)
        ops = [operate(c, hw.model, w, n, hw.link, hw.kind) for n in xs]
        total = [n * c.layout.dp for n in xs]
        ax_tp.plot(total, [o.output_tok_s for o in ops], marker=".", label=c.name)
        ax_ttft.plot(total, [o.ttft_s * 1e3 for o in ops], marker=".", label=c.name)
        ax_tpot.plot(total, [o.tpot_p99_s * 1e3 for o in ops], marker=".", label=c.name)
    if w.ttft_p99_s is not None:
        ax_ttft.axhline(w.ttft_p99_s * 1e3, color="red", linestyle="--", label="TTFT p99 SLO")
    if w.tpot_p99_s is not None:
        ax_tpot.axhline(w.tpot_p99_s * 1e3, color="red", linestyle="--", label="TPOT p99 SLO")
    for ax, title in ((ax_tp, "output tokens/s"), (ax_ttft, "TTFT (ms)"),
                      (ax_tpot, "TPOT p99 (ms)")):  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent sequences")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    ax_tpot.legend(fontsize=7)
    fig.suptitle(f"{plan.facts.name} on {hw.devices} x {hw.description}: prompt "
                 f"{w.prompt_len} + output {w.output_len} tokens (inferd plan)")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _zero():
    class Zero:
        output_tok_s = 0.0

    return Zero()

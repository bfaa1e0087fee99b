"""`inferd memory --plot FILE.png`: the estimate's stack (weights, KV cache, activations,
runtime) per device, across context lengths at the given concurrency and across
concurrency at the given context length, against the device's memory.

Each bar is one `estimate_memory` call with the command's other settings (the same figures as
the tables), so the plot shows where the KV cache overtakes the weights and where the sum meets
the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferd.bench.plots import pyplot
from inferd.config import ModelConfig
from inferd.memory.estimate import MemoryEstimate, estimate_memory

# component → colour (the dashboard's colours: inferd/server/dashboard/static/dashboard.js)
COMPONENTS = {"weights": "#2563eb", "KV cache": "#f59e0b", "activations (peak step)": "#10b981",
              "runtime": "#9ca3af"}  # fmt: skip


@dataclass(frozen=True)
class Stack:
    label: str  # the x tick
    parts: dict[str, int]  # component → bytes per device

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def stack_of(label: str, est: MemoryEstimate) -> Stack:
    d = est.per_device
    parts = [d.weights, d.kv_cache, d.activations.peak_bytes, d.overhead.bytes]
    return Stack(label, dict(zip(COMPONENTS, parts, strict=True)))


def contexts(limit: int) -> list[int]:
    """Powers of two from 256 up to `limit`, and `limit` itself."""
    out = [n for n in (2**k for k in range(8, 31)) if n < limit]
    return [*out[-7:], limit]


def concurrencies(given: int) -> list[int]:
    """Powers of two up to four times `given` (at least 32), and `given` itself."""
    top = max(32, 4 * given)
    return sorted({2**k for k in range(top.bit_length()) if 2**k <= top} | {given})


def sweep(config: ModelConfig, settings: dict[str, Any], base: MemoryEstimate):
    """(stacks across context at the base concurrency, stacks across concurrency at the base
    context): `estimate_memory(config, **settings)` at each point, the rest of `base` kept."""
    c, length = base.concurrency, base.max_model_len

    def estimate(**point: int) -> MemoryEstimate:
        return estimate_memory(config, **settings, **point)

    by_context = [stack_of(f"{n:,}", estimate(max_model_len=n, concurrency=c))
                  for n in contexts(length)]  # fmt: skip
    by_concurrency = [stack_of(str(k), estimate(max_model_len=length, concurrency=k))
                      for k in concurrencies(c)]  # fmt: skip
    return by_context, by_concurrency


def plot_memory(path: str, base: MemoryEstimate, config: ModelConfig, settings: dict[str, Any],
                capacity: int | None, capacity_source: str) -> None:  # fmt: skip
    """Draw the two sweeps around `base` (made with `settings`, the command's other flags) into
    the PNG file `path`; `capacity`: one device's memory, from `capacity_source`."""
    plt = pyplot()
    by_context, by_concurrency = sweep(config, settings, base)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    gib = 2**30
    top = max(s.total for s in by_context + by_concurrency)
    # NOTE: a capacity far above every bar would flatten them: then it is written, not drawn.
    draw_line = capacity is not None and capacity <= 3 * top
    titles = (f"across context length, C = {base.concurrency} request(s)",
              f"across concurrency, L = {base.max_model_len:,} tokens")  # fmt: skip
    xlabels = ("context length L (tokens)", "concurrent requests C")
    for ax, stacks, title, xlabel in zip(axes, (by_context, by_concurrency), titles, xlabels,
                                         strict=True):  # fmt: skip
        x = range(len(stacks))
        bottom = [0.0] * len(stacks)
        for name, colour in COMPONENTS.items():
            heights = [s.parts[name] / gib for s in stacks]
            if any(heights):
                ax.bar(x, heights, bottom=bottom, color=colour, label=name)
                bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        ax.set_xticks(list(x), [s.label for s in stacks], rotation=30)
        ax.set_xlabel(xlabel)
        ax.set_title(title, fontsize=10)
        if draw_line:
            ax.axhline(
                capacity / gib,
                color="#dc2626",
                linestyle="--",
                label=f"device memory ({capacity / gib:,.1f} GiB, {capacity_source})",
            )
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("GiB per device")
    axes[0].legend(fontsize=8, loc="upper left")
    note = ""
    if capacity is not None and not draw_line:
        note = f"; device memory {capacity / gib:,.1f} GiB ({capacity_source}) is above the scale"
    tp = f", TP={base.tensor_parallel_size}" if base.tensor_parallel_size > 1 else ""
    fig.suptitle(f"{base.name}: {base.device}, weights {base.weight_plan.scheme}, KV cache "
                 f"{base.kv_cache_dtype}, step budget {base.max_num_batched_tokens} tokens{tp}"
                 f"{note}", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

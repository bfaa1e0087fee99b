"""What a model takes in memory, as the budget of `--max-loaded-memory` counts it.

A model's figure is its weights, its KV pool and its runtime (the activations of its largest
step and the process's own overhead), summed over every process that holds it (each
`--data-parallel-size` replica and each tensor-parallel rank holds its own). Before a model
loads, the figure is `inferd memory`'s estimate for the settings its engine will run with (the
KV pool exactly as the engine plans it); once it is loaded, the weights and the KV pool are what
its engine reports it holds, and the runtime part stays the estimate's (nothing measures it
apart). The figures are made in the command layer (commands/serve_model_memory.py), which
knows the engine; the pool only adds them up.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelMemory:
    weights: int
    kv_pool: int
    runtime: int  # activations of the largest step + runtime overhead (estimated)
    processes: int = 1  # the engine processes the figures are summed over
    measured: bool = False  # weights and KV pool as the loaded engine reports them
    on_gpu: bool = False  # held in GPU memory (Ollama's size_vram)

    @property
    def total(self) -> int:
        return self.weights + self.kv_pool + self.runtime

    def describe(self) -> str:
        how = "measured" if self.measured else "estimated"
        where = f" over {self.processes} engine processes" if self.processes > 1 else ""
        return (f"{how}{where}: weights {size_text(self.weights)}, KV pool "
                f"{size_text(self.kv_pool)}, runtime {size_text(self.runtime)}")  # fmt: skip

    def to_dict(self) -> dict[str, int | bool | str]:
        return {"total_bytes": self.total, "weights_bytes": self.weights,
                "kv_pool_bytes": self.kv_pool, "runtime_bytes": self.runtime,
                "processes": self.processes,
                "source": "measured" if self.measured else "estimated"}  # fmt: skip


def size_text(n: int) -> str:
    """Bytes as people read them: binary units, three significant figures."""
    for unit, power in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << power:
            return f"{n / (1 << power):.3g} {unit}"
    return f"{n} B"

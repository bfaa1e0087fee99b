"""`inferd memory --measure` without a GPU: the CUDA branch driven by a fake device-stats object
(an allocator that counts what a fake engine allocates), and the CPU heap statistics."""

from __future__ import annotations

import argparse

from inferd.config import ModelConfig
from inferd.memory.estimate import estimate_memory
from inferd.memory.measure import measure_memory
from inferd.memory.snapshot import heap_stats, take_snapshot

MiB, GiB = 1 << 20, 1 << 30
CONFIG = ModelConfig(architecture="llama", vocab_size=32000, hidden_size=2048,
                     intermediate_size=5632, num_layers=22, num_heads=32, num_kv_heads=4,
                     head_dim=64, max_position_embeddings=2048)  # fmt: skip


class FakeCuda:
    """A caching allocator's counters: allocations round up to 2 MiB segments it keeps
    (reserved) after they are freed; the device also holds a context outside the allocator."""

    context = 500 * MiB
    total = 80 * GiB

    def __init__(self) -> None:
        self.allocated = self.reserved = self.peak = self.peak_reserved = 0
        self.synced = 0

    def malloc(self, n: int) -> None:
        self.allocated += n
        self.reserved = max(self.reserved, -(-self.allocated // (2 * MiB)) * 2 * MiB)
        self.peak = max(self.peak, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, n: int) -> None:
        self.allocated -= n  # reserved stays: the allocator caches the block

    def synchronize(self) -> None:
        self.synced += 1

    def memory_allocated(self) -> int:
        return self.allocated

    def memory_reserved(self) -> int:
        return self.reserved

    def max_memory_allocated(self) -> int:
        return self.peak

    def max_memory_reserved(self) -> int:
        return self.peak_reserved

    def reset_peak_memory_stats(self) -> None:
        self.peak, self.peak_reserved = self.allocated, self.reserved

    def mem_get_info(self) -> tuple[int, int]:
        return self.total - self.context - self.reserved, self.total


class _Output:
    def __init__(self, n_prompt: int, n_gen: int):
        self.prompt_token_ids = list(range(n_prompt))
        self.outputs = [argparse.Namespace(token_ids=list(range(n_gen)))]


def fake_engine(cuda: FakeCuda, weights: int, activations: int):
    class FakeLLM:
        def __init__(self, kv_cache_memory: int, device: str, **engine_arguments):
            assert device == "cuda"
            self.kv = kv_cache_memory
            cuda.malloc(weights + kv_cache_memory)

        def generate(self, prompts, params, use_tqdm=True):
            cuda.malloc(activations)  # a step's temporaries, freed after it
            cuda.free(activations)
            return [_Output(12, params.max_tokens) for _ in prompts]

        def rank_reports(self) -> list[dict]:
            return []

        def kv_cache_bytes(self) -> int:
            return self.kv

        def shutdown(self) -> None:
            pass

    return FakeLLM


def test_cuda_branch_explains_allocated_reserved_peak_and_context():
    cuda = FakeCuda()
    est = estimate_memory(CONFIG, dtype="bf16", device="cuda", device_memory=80 * GiB,
                          max_model_len=1024, concurrency=4)  # fmt: skip
    weights, acts = est.per_device.weights, 300 * MiB + 12345
    m = measure_memory(None, CONFIG, est, max_tokens=5, device_stats=cuda,
                       make_llm=fake_engine(cuda, weights, acts))  # fmt: skip
    assert m.device == "cuda" and m.generated_tokens == 20 and cuda.synced == 3
    before, loaded, done = m.snapshots
    assert before.cuda_allocated == 0 and before.cuda_device_used == FakeCuda.context
    assert loaded.cuda_allocated == weights + est.per_device.kv_cache
    assert done.cuda_reserved >= done.cuda_allocated + acts  # the freed temporaries stay cached
    assert m.peak.cuda_allocated == loaded.cuda_allocated + acts
    rows = {what: (pred, got) for what, pred, got, _ in m.rows}
    assert rows["load: weights + KV pool (allocated)"] == (
        weights + est.per_device.kv_cache,
        loaded.cuda_allocated,
    )
    assert rows["generation: activations (peak − allocated)"][1] == acts
    assert rows["allocator cache (reserved − allocated)"][1] == (
        done.cuda_reserved - done.cuda_allocated)  # fmt: skip
    assert rows["CUDA context (device used − reserved)"][1] == FakeCuda.context
    assert rows["KV pool (allocated by the engine)"] == (est.per_device.kv_cache,) * 2


def test_the_command_prints_the_snapshot_table(monkeypatch, capsys):
    from rich.console import Console

    from inferd.commands.memory_tables import print_snapshots as _print_snapshots

    cuda = FakeCuda()
    est = estimate_memory(CONFIG, dtype="bf16", device="cuda", device_memory=80 * GiB,
                          max_model_len=512)  # fmt: skip
    m = measure_memory(None, CONFIG, est, max_tokens=2, device_stats=cuda,
                       make_llm=fake_engine(cuda, est.per_device.weights, 64 * MiB))  # fmt: skip
    _print_snapshots(Console(width=200), m)
    text = capsys.readouterr().out
    for label in ("before load", "after load", "after generation", "peak (generation)",
                  "allocated", "reserved", "device in use"):  # fmt: skip
        assert label in text


def test_heap_statistics_see_an_allocation():
    in_use, held = heap_stats()
    assert held >= in_use > 0
    block = bytearray(64 * MiB)  # one malloc'd (mmapped) block
    grown, _ = heap_stats()
    assert grown - in_use >= 64 * MiB
    snap = take_snapshot("now", "cpu")
    assert snap.heap_in_use >= 64 * MiB and snap.cuda_allocated is None
    del block

"""CUDA graphs for decode steps (GPU only; `--enforce-eager` turns them off).

A decode step of a small model launches a few hundred small kernels; on a GPU the launch cost,
not the math, sets its time. A CUDA graph records those launches once and replays them with one
call. Replaying needs fixed shapes and fixed addresses, so:

* graphs are captured for a set of batch sizes (1, 2, 4, 8, then every 8 up to max_num_seqs) and
  a step is padded up to the next captured size; padding rows write their K/V to slot -1, which
  the store kernel skips, and their logits are dropped;
* every input lives in a static buffer that each step overwrites in place (block tables are
  as wide as max_model_len needs);
* the Triton backend's decode split is fixed per captured size, so the launch grid depends only
  on the batch size, never on context lengths; the backend's metadata for a captured size is
  built once, from the static buffers (a pure decode step: no host-side work lists to refresh).

Only the model forward and the LM head are in the graph; sampling runs eagerly after it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from inferd.attention.backend import AttentionBatch, ForwardContext, GroupBatch

if TYPE_CHECKING:
    from inferd.engine.execution.device_state import SequenceStep
    from inferd.engine.execution.runner import ModelRunner

log = logging.getLogger(__name__)


def capture_sizes(max_batch: int) -> list[int]:
    sizes = [s for s in (1, 2, 4) if s < max_batch] + list(range(8, max_batch + 8, 8))
    return sorted({min(s, max_batch) for s in sizes})


def _decode_partitions(batch: int, kv_heads: int, sm_count: int) -> int:
    """About two programs per SM across the batch's (sequence, KV head) pairs, 1 to 16."""
    wanted = max(1, -(-2 * sm_count // (batch * kv_heads)))
    return min(16, 1 << (wanted - 1).bit_length())


class CUDAGraphDecoder:
    def __init__(self, runner: ModelRunner, max_batch: int, max_model_len: int):
        self.runner = runner
        dev = runner.device
        self.sizes = capture_sizes(max_batch)
        width = -(-max_model_len // runner.block_size)
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=dev)
        groups = len(runner.groups)
        self.slot_mappings = [
            torch.full((n,), -1, dtype=torch.int64, device=dev) for _ in range(groups)
        ]
        self.block_tables = [
            torch.zeros(n, width, dtype=torch.int32, device=dev) for _ in range(groups)
        ]
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.capture_seconds = 0.0

    def _batch(self, bs: int) -> AttentionBatch:
        """A decode step of `bs` sequences over the static buffers."""
        groups = [
            GroupBatch(
                self.slot_mappings[g][:bs],
                self.block_tables[g][:bs],
                self.runner.block_size,
                window,
            )  # fmt: skip
            for g, (window, _) in enumerate(self.runner.groups)
        ]
        return AttentionBatch(
            query_start_loc=self.query_start_loc[: bs + 1],
            seq_lens=self.seq_lens[:bs],
            positions=self.positions[:bs],
            groups=groups,
            query_lens_cpu=[1] * bs,
            seq_lens_cpu=[1] * bs,
        )

    def _context(self, bs: int, decode_partitions: int) -> ForwardContext:
        """The context a captured step runs with: the Triton backend's metadata for the static
        buffers, with the decode split fixed for this batch size."""
        batch = self._batch(bs)
        metadata = self.runner.backend.build_metadata(batch, decode_partitions=decode_partitions)
        return ForwardContext(batch, metadata, self.runner.kv_caches, self.runner.backend)

    @torch.inference_mode()
    def capture(self) -> float:
        start = time.monotonic()
        model = self.runner.model
        props = torch.cuda.get_device_properties(self.runner.device)
        pool = None
        for bs in reversed(self.sizes):  # largest first, so smaller graphs reuse its memory
            parts = _decode_partitions(bs, model.config.num_kv_heads, props.multi_processor_count)
            for _ in range(2):  # warm up: Triton compiles, allocator settles
                model.compute_logits(model(self.input_ids[:bs], self.positions[:bs],
                                           self._context(bs, parts)))  # fmt: skip
            torch.cuda.synchronize(self.runner.device)
            graph = torch.cuda.CUDAGraph()
            ctx = self._context(bs, parts)
            with torch.cuda.graph(graph, pool=pool):
                logits = model.compute_logits(model(self.input_ids[:bs], self.positions[:bs], ctx))
            pool = graph.pool()
            self.graphs[bs] = (graph, logits)
        torch.cuda.synchronize(self.runner.device)
        self.capture_seconds = time.monotonic() - start
        log.info("captured %d CUDA graphs (batch %s) in %.1f s", len(self.graphs),
                 self.sizes, self.capture_seconds)  # fmt: skip
        return self.capture_seconds

    def can_run(self, steps: list[SequenceStep]) -> bool:
        return (
            bool(self.graphs)
            and len(steps) <= self.sizes[-1]
            and all(len(s.token_ids) == 1 and s.needs_logits and not s.all_logits for s in steps)
        )

    def run(self, steps: list[SequenceStep]) -> torch.Tensor:
        bs = self.fill(steps)
        graph, logits = self.graphs[bs]
        graph.replay()
        return logits[: len(steps)]

    def fill(self, steps: list[SequenceStep]) -> int:
        """Write a decode step into the static buffers; returns the captured size it runs as
        (the rows past the step's are padding: slot -1, logits dropped)."""
        n = len(steps)
        bs = next(s for s in self.sizes if s >= n)
        bsz = self.runner.block_size
        ids = np.zeros(bs, dtype=np.int64)
        pos = np.zeros(bs, dtype=np.int64)
        lens = np.ones(bs, dtype=np.int32)
        for i, s in enumerate(steps):
            ids[i], pos[i], lens[i] = s.token_ids[0], s.num_computed, s.num_computed + 1
        self.input_ids[:bs].copy_(torch.from_numpy(ids), non_blocking=True)
        self.positions[:bs].copy_(torch.from_numpy(pos), non_blocking=True)
        self.seq_lens[:bs].copy_(torch.from_numpy(lens), non_blocking=True)
        for g in range(len(self.runner.groups)):
            slots = np.full(bs, -1, dtype=np.int64)
            table = np.zeros((bs, self.block_tables[g].shape[1]), dtype=np.int32)
            for i, s in enumerate(steps):
                t = s.block_tables[g]
                table[i, : len(t)] = t
                slots[i] = t[s.num_computed // bsz] * bsz + s.num_computed % bsz
            self.slot_mappings[g][:bs].copy_(torch.from_numpy(slots), non_blocking=True)
            self.block_tables[g][:bs].copy_(torch.from_numpy(table), non_blocking=True)
        return bs

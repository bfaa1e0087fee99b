"""Settings of the Batch API (`/v1/files`, `/v1/batches`), from `inferd serve` flags
(inferd/commands/serve_batch.py); plain data, so the command need not import FastAPI."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_FILE_BYTES = 64 << 20
DEFAULT_MAX_BATCH_LINES = 50_000  # OpenAI's limit per batch
DEFAULT_CONCURRENCY = 2
# NOTE: the largest priority the engine takes (a 64-bit integer): under --scheduling-policy
# priority a batch line waits behind every request that did not ask for this very value, and a
# running one is the first preempted when an interactive request finds no room.
BATCH_PRIORITY = 2**63 - 1
SWEEP_INTERVAL_S = 60.0


@dataclass(frozen=True)
class BatchSettings:
    files_dir: str | None = None  # None: <cache_dir()>/files
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES  # --max-file-bytes: an upload's content
    max_batch_lines: int = DEFAULT_MAX_BATCH_LINES  # --max-batch-lines: requests per batch
    # --batch-concurrency: batch lines in flight at once, over every batch of the server: each
    # adds a row to every engine step, so this bound is what keeps interactive latency.
    concurrency: int = DEFAULT_CONCURRENCY
    # Under --scheduling-policy priority: the priority each line runs at; None under fcfs, where
    # a line runs at priority 0 and only `concurrency` keeps it from crowding interactive ones.
    priority: int | None = None
    sweep_interval_s: float = SWEEP_INTERVAL_S  # how often expired files are deleted

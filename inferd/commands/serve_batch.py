"""`inferd serve` flags of the Batch API (`/v1/files`, `/v1/batches`), and the `BatchSettings`
they become (inferd/server/batches/settings.py)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from inferd.commands.engine_args import size_arg

if TYPE_CHECKING:
    from inferd.server.batches.settings import BatchSettings


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def add_batch_arguments(parser: argparse.ArgumentParser) -> None:
    from inferd.server.batches import settings  # plain data, no FastAPI

    group = parser.add_argument_group("Batch API (/v1/files, /v1/batches)")
    group.add_argument(
        "--max-file-bytes",
        type=size_arg,
        default=settings.DEFAULT_MAX_FILE_BYTES,
        help="largest file POST /v1/files takes, e.g. 200MiB (default 64MiB); larger is 413",
    )
    group.add_argument(
        "--max-batch-lines",
        type=_positive,
        default=settings.DEFAULT_MAX_BATCH_LINES,
        help="most requests in one batch; a larger input file is refused at create "
        f"(default {settings.DEFAULT_MAX_BATCH_LINES}, OpenAI's)",
    )
    group.add_argument(
        "--batch-concurrency",
        type=_positive,
        default=settings.DEFAULT_CONCURRENCY,
        help="batch lines in flight at once, over every batch (default "
        f"{settings.DEFAULT_CONCURRENCY}): each line in flight adds a row to every engine "
        "step, so this bound is what keeps interactive latency; under --scheduling-policy "
        "priority the lines also run at the lowest priority (interactive requests go first and "
        "preempt them)",
    )


def batch_settings(args: argparse.Namespace) -> BatchSettings:
    from inferd.server.batches.settings import BATCH_PRIORITY, BatchSettings

    by_priority = getattr(args, "scheduling_policy", "fcfs") == "priority"
    return BatchSettings(
        max_file_bytes=args.max_file_bytes,
        max_batch_lines=args.max_batch_lines,
        concurrency=args.batch_concurrency,
        priority=BATCH_PRIORITY if by_priority else None,
    )

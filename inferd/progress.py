"""What start-up is doing, on stderr: one status line per slow step, a bar for long byte copies.

    with status("building the tokenizer"):         # "inferd: building the tokenizer ... 3.1 s"
        ...
    with byte_progress("assembling the embedded model", total_bytes) as advance:
        advance(len(block))

Call these only on the slow path (a cache miss), so a warm start prints nothing. Output goes to
stderr, never stdout: `inferd generate` pipes its text. On a terminal a spinner or bar shows
while the step runs; elsewhere (logs, pipes) one line when it starts and one when it ends.

Silencing follows the standard `logging` levels of the `inferd.progress` logger, so there is no
switch of inferd's own: `--quiet` sets it to WARNING, and a library user writes
`logging.getLogger("inferd").setLevel(logging.WARNING)`. Left unset (the default for both the
CLI and `LLM()`), progress shows, as vLLM's `LLM()` shows its INFO start-up lines.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

LOGGER_NAME = "inferd.progress"


def set_quiet(quiet: bool) -> None:
    """`--quiet`: no status lines or bars (errors still reach stderr)."""
    logging.getLogger(LOGGER_NAME).setLevel(logging.WARNING if quiet else logging.INFO)


def enabled() -> bool:
    """True unless `inferd.progress` (or `inferd`) was set to a level above INFO. The root
    logger does not count: its default, WARNING, would hide progress from every new user."""
    for name in (LOGGER_NAME, "inferd"):
        level = logging.getLogger(name).level
        if level != logging.NOTSET:
            return level <= logging.INFO
    return True


def _line(text: str) -> None:
    print(f"inferd: {text}", file=sys.stderr, flush=True)


def say(text: str) -> None:
    """One line of start-up news (which kernels, which mode), silenced like the rest."""
    if enabled():
        _line(text)


def _on_terminal() -> bool:
    return sys.stderr.isatty()


@contextmanager
def status(step: str) -> Iterator[None]:
    """Say that `step` runs and, when it is done, how many seconds it took."""
    if not enabled():
        yield
        return
    start = time.monotonic()
    if _on_terminal():
        from rich.console import Console

        with Console(stderr=True).status(f"{step} ...", spinner="dots"):
            yield
    else:
        _line(f"{step} ...")
        yield
    _line(f"{step}: {time.monotonic() - start:.1f} s")


@contextmanager
def byte_progress(step: str, total: int) -> Iterator[Callable[[int], None]]:
    """A bar over `total` bytes on a terminal (the start and end lines elsewhere); the caller
    reports each chunk with the function this yields."""
    if not enabled() or not _on_terminal():
        with status(step):
            yield lambda n: None
        return
    from tqdm import tqdm

    start = time.monotonic()
    with tqdm(total=total, desc=step, unit="B", unit_scale=True, unit_divisor=1024,
              file=sys.stderr, leave=False, dynamic_ncols=True) as bar:  # fmt: skip
        yield bar.update
    _line(f"{step}: {time.monotonic() - start:.1f} s")

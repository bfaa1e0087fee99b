"""The cyclic garbage collector held off while a command loads its engine.

Starting allocates a few million long-lived objects (importing torch alone makes most of them),
and each allocation burst triggers collections that walk them all again: about a fifth of a
second of a warm start, for garbage there is hardly any of. So `generate`, `chat` and `serve`
hold the collector from the command line until their engine is built, then freeze what exists
(moved out of the collector's sight for good: modules, weights' metadata) and let it run on
what the command allocates from then on.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# Commands that build an engine and call `engine_started` once it is there.
HOLDING_COMMANDS = ("generate", "chat", "serve")


@contextmanager
def holding_collector() -> Iterator[None]:
    """The collector off from here until `engine_started`; on again, whatever happens, when the
    command ends (one that fails before its engine is built never calls `engine_started`)."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def engine_started() -> None:
    """Freeze what start-up made and let the collector run, if a command start held it."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()

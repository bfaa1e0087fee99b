"""How long the engine core's OpenMP threads spin once their work runs out, when the core has a
process of its own.

PyTorch's CPU ops and inferd's C kernels share one OpenMP runtime, GNU libgomp (cpu_kernels/
build.py). A libgomp thread whose parallel region ended keeps its core busy-waiting for the
next one, by default for 300,000 spins, before it sleeps. Inside a forward pass
that is what a decode wants: the gaps between regions are microseconds. Between two steps,
though, the core's loop runs Python alone (scheduling, sampling, sending the outputs), and
meanwhile every other OpenMP thread spins on a core the front end needs: the server's process,
woken by each step's outputs, then preempts a compute thread instead of taking an idle core,
and the next forward pass waits for that thread. On a machine with as many cores as compute
threads that is what one client streaming tokens pays (`python scripts/serving_overhead.py`).

So a spawned core is told to spin `CORE_SPIN_COUNT` times (a spin is one `pause` instruction,
tens to a hundred-odd cycles depending on the CPU: well under a millisecond in all): long enough
to bridge a forward pass's gaps, short enough to give the core back between steps. The
variable reaches the spawned interpreter, and the tensor-parallel workers it spawns in turn,
before libgomp is loaded there. A user who set either of libgomp's own knobs (`GOMP_SPINCOUNT`,
`OMP_WAIT_POLICY`) keeps theirs. An in-process engine (`LLM()`, `--no-engine-core-process`)
runs under whatever its process was started with: libgomp read it at import.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

SPIN_COUNT_ENV = "GOMP_SPINCOUNT"
USER_KNOBS = (SPIN_COUNT_ENV, "OMP_WAIT_POLICY")
CORE_SPIN_COUNT = "10000"


@contextmanager
def core_spin_count() -> Iterator[str | None]:
    """While a core process is spawned: `GOMP_SPINCOUNT` is the core's spin count, unless the
    user set one of libgomp's knobs. Yields the value the child gets (None: the user's)."""
    if any(name in os.environ for name in USER_KNOBS):
        yield None
        return
    os.environ[SPIN_COUNT_ENV] = CORE_SPIN_COUNT
    try:
        yield CORE_SPIN_COUNT
    finally:
        os.environ.pop(SPIN_COUNT_ENV, None)

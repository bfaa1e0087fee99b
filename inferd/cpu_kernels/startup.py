"""The C kernels at engine start-up: built (or loaded from the cache) before the first request,
never inside one, and said out loud.

On a CPU device the engine calls `prepare_cpu_kernels` once. It prints one status line on stderr,
`cpu kernels: avx2 (built in 1.1 s)` or `cpu kernels: avx512-vnni (cached)`; where the kernels
cannot be used it logs a WARNING with the reason, and PyTorch ops serve instead (slower, and
greedy output can differ in the last float bits from a run with the kernels).
"""

from __future__ import annotations

import logging
import os

import torch

from inferd.cpu_kernels.build import Kernels, KernelsUnavailable, current_kernels
from inferd.cpu_kernels.variants import ENV, requested
from inferd.progress import say

log = logging.getLogger(__name__)


def status_line(kernels: Kernels) -> str:
    line = kernels.status()
    if kernels.reason.startswith("forced"):
        line += f", {kernels.reason}"
    return line


def prepare_cpu_kernels(device: torch.device) -> Kernels | None:
    """Build or load the kernels this CPU will use; None (after a WARNING) where they cannot
    be used. Raises ValueError for an INFERD_CPU_KERNELS value that names no variant."""
    if device.type != "cpu":
        return None
    requested(os.environ.get(ENV))  # a value that names nothing is the user's error: say so now
    try:
        kernels = current_kernels()
    except KernelsUnavailable as e:
        log.warning("cpu kernels: none (%s); using PyTorch ops instead", e)
        return None
    say(status_line(kernels))
    return kernels
